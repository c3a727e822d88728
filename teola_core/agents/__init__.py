"""Agents whose graph grows while they run (beyond the paper's static workflows)."""

from teola_core.agents.admission import ProgramAdmission
from teola_core.agents.dropin import AgentDropIn
from teola_core.agents.host import AgentFeatures
from teola_core.agents.program import Program
from teola_core.agents.runtime import AgentRuntime
from teola_core.agents.tool_cache import ToolResultCache, canonical_args
from teola_core.agents.ttl import ToolDurations, continuum_ttl

__all__ = [
    "AgentDropIn",
    "AgentFeatures",
    "AgentRuntime",
    "Program",
    "ProgramAdmission",
    "ToolDurations",
    "ToolResultCache",
    "canonical_args",
    "continuum_ttl",
]
