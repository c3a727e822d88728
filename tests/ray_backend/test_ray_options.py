"""The `ray=` option: its shape is checked, and checked against the app's engines, with
errors that name what is wrong. No cluster needed."""

from __future__ import annotations

import threading

import pytest
from ray_test_engines import DriverOnly, Embedder, StatefulLLM

from teola_core.engines.choices import EngineChoices
from teola_core.engines.protocol import Engine, EngineSet
from teola_core.runtime.backends import RuntimePerLoop, make_runtime
from teola_core.runtime.parts import SharedOptions
from teola_core.runtime.ray.options import EngineOptions, RayOptions


def engines() -> EngineSet:
    return EngineSet().add(Embedder()).add(StatefulLLM()).add(DriverOnly("framework"))


def test_placements_by_name_and_class_most_specific_last() -> None:
    options = RayOptions.parse(
        {
            "address": "auto",
            "engines": {
                Engine: {"num_cpus": 0.5},
                Embedder: {"num_replicas": 2, "resources": {"nodeA": 1}},
                "emb": {"num_gpus": 1},
            },
        }
    )
    placed = options.placements(engines())
    assert placed["framework"] is None  # driver-only: stays in the driver whatever a base-class key says
    assert placed["emb"] == EngineOptions(num_replicas=2, num_cpus=0.5, num_gpus=1, resources={"nodeA": 1})
    assert placed["llm"] == EngineOptions(num_cpus=0.5)
    assert placed["emb"].request() == {"CPU": 0.5, "GPU": 1.0, "nodeA": 1.0}
    assert EngineOptions().request() == {"CPU": 1.0}  # Ray reserves one CPU for an actor by default


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"adress": "auto"}, r"unknown key\(s\) \['adress'\]"),
        ({"address": 10001}, "address must be a string"),
        ({"init": {"address": "auto"}}, "give the address as 'address'"),
        ({"engines": {"emb": {"num_replica": 2}}}, r"engines\['emb'\]: unknown option\(s\) \['num_replica'\]"),
        ({"engines": {"emb": {"num_replicas": 0}}}, "num_replicas must be at least 1"),
        ({"engines": {"emb": {"num_replicas": 1.5}}}, "num_replicas must be an int"),
        ({"engines": {"emb": {"num_gpus": -1}}}, "num_gpus must be a non-negative number"),
        ({"engines": {"emb": {"resources": {"nodeA": "one"}}}}, r"resources\['nodeA'\] must be a non-negative"),
        ({"engines": {"emb": {"in_driver": "yes"}}}, "in_driver must be True or False"),
        ({"engines": {3: {}}}, "keys are engine names or Engine subclasses"),
        ("auto", "expected a dict"),
    ],
)
def test_a_malformed_option_names_what_is_wrong(option: object, message: str) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        RayOptions.parse(option)  # type: ignore[arg-type]


def test_keys_must_match_the_apps_engines() -> None:
    with pytest.raises(ValueError, match=r"names 'embedder', which this app does not use \(its engines: emb, "):
        RayOptions.parse({"engines": {"embedder": {}}}).placements(engines())
    with pytest.raises(ValueError, match="names class Unused, which no engine of this app is"):

        class Unused(Engine):
            async def run(self, calls):  # type: ignore[no-untyped-def]
                return []

        RayOptions.parse({"engines": {Unused: {}}}).placements(engines())


def test_ray_options_need_the_ray_backend() -> None:
    with pytest.raises(ValueError, match="ray= options need backend='ray'"):
        RuntimePerLoop(engines(), "local", ray={"address": "auto"})
    with pytest.raises(ValueError, match="ray= options need backend='ray'"):
        make_runtime(engines(), "reference", ray={})
    with pytest.raises(ValueError, match="unknown backend 'dask'"):
        RuntimePerLoop(engines(), "dask")


def test_an_engine_that_does_not_pickle_is_named_with_the_way_out() -> None:
    pytest.importorskip("ray")
    unpicklable = Embedder()
    unpicklable.lock = threading.Lock()  # as an open connection would: it does not pickle
    with pytest.raises(TypeError, match=r"engine 'emb' cannot be sent to a Ray actor: .*'in_driver': True"):
        RuntimePerLoop(EngineSet().add(unpicklable), "ray")


def test_options_shared_by_the_parts_of_an_app_are_checked_for_the_app() -> None:
    """Each part places the keys that match its engines; the app fails on a key no part matched."""
    options = RayOptions.parse({"engines": {"emb": {"num_replicas": 2}, StatefulLLM: {"num_gpus": 1}}})
    embeds, llms = EngineSet().add(Embedder()), EngineSet().add(StatefulLLM())
    with pytest.raises(ValueError, match="names class StatefulLLM, which no engine of this app is"):
        options.placements(embeds)
    parts = options.for_parts()
    assert parts.placements(embeds)["emb"] == EngineOptions(num_replicas=2)
    assert parts.placements(llms)["llm"] == EngineOptions(num_gpus=1)
    parts.check_keys([embeds, llms])
    with pytest.raises(ValueError, match=r"names class StatefulLLM, which no engine of this app is \(emb\)"):
        parts.check_keys([embeds, EngineSet()])
    with pytest.raises(ValueError, match=r"engine 'framework' \(DriverOnly\) cannot run in a Ray actor"):
        RayOptions.parse({"engines": {"framework": {}}}).for_parts().placements(engines())
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['partial'\]"):
        RayOptions.parse({"partial": True})


def test_a_part_of_a_part_leaves_the_check_to_the_apps_owner() -> None:
    owner = SharedOptions(EngineChoices(None, {}), "ray", {"engines": {"emb": {}}})
    part = SharedOptions(EngineChoices(owner.part_options()["engines"], {}), "ray", owner.part_options()["ray"])
    part.check([EngineSet()])  # the key may be another part's
    with pytest.raises(ValueError, match="engines names 'emb', which this app does not use"):
        owner.check([EngineSet()])
    owner.check([EngineSet(), engines()])
    assert "ray" not in SharedOptions(EngineChoices(None, {}), "local", None).part_options()
