"""Program-level order for the model calls that LangChain code makes itself.

A LangGraph node, or a chain run as LangChain runs it, calls its model directly, so
Teola cannot send the request; it can decide when it goes. Each run (a program) gets a
callback handler (`gate.RunGate`) that holds its model calls until Teola's scheduler
admits them (`admission.ModelAdmission`), earlier runs first, within the bound learned
from the model's server (`teola_adapters.server_load`) or given; `runs.ProgramRuns` ranks
the runs of one optimized object and keeps one admission per event loop.
"""
