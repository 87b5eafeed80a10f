"""Pipeline specs: the shipped pipelines, the DAG helpers and every validation error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from onnx_models.catalog import CATALOG
from onnx_models.spec import (
    DEFAULT_BATCH_SIZES,
    PIPELINES_DIR,
    PipelineSpecError,
    load_pipeline,
    pipeline_path,
    shipped_pipelines,
)

MODEL = str(CATALOG["eye_tracking"].path)  # any real model file, by absolute path


def module(mid: int, pres: list[int], subs: list[int], **extra: Any) -> dict[str, Any]:
    return {"name": f"m{mid}", "id": mid, "model": MODEL, "pres": pres, "subs": subs, **extra}


def chain(n: int = 3) -> list[dict[str, Any]]:
    return [module(i, [i - 1] if i > 1 else [], [i + 1] if i < n else []) for i in range(1, n + 1)]


def write_spec(tmp_path: Path, modules: list[dict] | None = None, **top: Any) -> Path:
    data = {"name": "p", "slo_ms": 400, "modules": chain() if modules is None else modules}
    data.update(top)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    return path


# --- the shipped pipelines ---------------------------------------------------------------


def test_five_pipelines_are_shipped() -> None:
    assert shipped_pipelines() == ("dag", "dag_dynamic", "ga", "live", "traffic")


def test_slos_are_the_papers() -> None:
    # PARD §5.1: 400, 500, 600 and 420 ms for tm, lv, ga and da (dag_dynamic is da too).
    slos = {name: load_pipeline(pipeline_path(name)).slo_ms for name in shipped_pipelines()}
    assert slos == {"traffic": 400, "live": 500, "ga": 600, "dag": 420, "dag_dynamic": 420}


@pytest.mark.parametrize(
    ("name", "slo_ms", "order"),
    [
        ("traffic", 400, ["object_detection", "face_recognition", "text_recognition"]),
        (
            "live",
            500,
            [
                "person_detection",
                "face_recognition",
                "expression_recognition",
                "eye_tracking",
                "pose_recognition",
            ],
        ),
        (
            "dag",
            420,
            ["person_detection", "pose_recognition", "face_recognition", "expression_recognition"],
        ),
        (
            "dag_dynamic",
            420,
            ["person_detection", "pose_recognition", "face_recognition", "expression_recognition"],
        ),
        (
            "ga",
            600,
            [
                "game_object_detection",
                "kill_count_detection",
                "alive_player_recognition",
                "health_value_recognition",
                "icon_recognition",
            ],
        ),
    ],
)
def test_shipped_pipeline_loads(name: str, slo_ms: float, order: list[str]) -> None:
    spec = load_pipeline(pipeline_path(name))
    assert (spec.name, spec.slo_ms) == (name, slo_ms)
    assert [m.name for m in spec.topological_order()] == order
    assert spec.path == PIPELINES_DIR / f"{name}.json"
    for m in spec.modules:
        card = CATALOG[m.name]
        assert m.model == card.path  # shared models are one file across pipelines
        assert m.input_shape == card.input_shape
        assert m.batch_sizes == DEFAULT_BATCH_SIZES


def test_chains_have_one_path() -> None:
    live = load_pipeline(pipeline_path("live"))
    assert live.paths() == (("1", "2", "3", "4", "5"),)  # ids as the task server keeps them
    assert live.paths(from_id=3) == (("3", "4", "5"),)
    assert [m.id for m in live.downstream(2)] == ["3", "4", "5"]
    assert live.downstream(5) == ()
    assert live.source.id == "1"
    assert [m.id for m in live.sinks] == ["5"]


def test_game_analysis_is_a_chain_of_five_modules() -> None:
    # PARD §5.1 lists ga's five models as a cascade; only da splits and merges.
    ga = load_pipeline(pipeline_path("ga"))
    assert len(ga.modules) == 5
    assert ga.paths() == (("1", "2", "3", "4", "5"),)
    assert [(m.pres, m.subs) for m in ga.topological_order()] == [
        ((), ("2",)),
        (("1",), ("3",)),
        (("2",), ("4",)),
        (("3",), ("5",)),
        (("4",), ()),
    ]
    assert ga.source.name == "game_object_detection"
    assert [m.name for m in ga.sinks] == ["icon_recognition"]


def test_dag_splits_and_merges() -> None:
    dag = load_pipeline(pipeline_path("dag"))
    assert dag.paths() == (("1", "2", "4"), ("1", "3", "4"))  # PARD takes the maximum over these
    assert dag.paths(from_id=3) == (("3", "4"),)
    assert [m.name for m in dag.downstream(1)] == [
        "pose_recognition",
        "face_recognition",
        "expression_recognition",
    ]
    assert [m.id for m in dag.downstream(2)] == ["4"]
    assert dag.module(4).pres == ("2", "3")
    with pytest.raises(KeyError, match="no module with id 9"):
        dag.module(9)


def test_pipeline_path_takes_a_name_or_a_path(tmp_path: Path) -> None:
    assert pipeline_path("traffic") == PIPELINES_DIR / "traffic.json"
    assert pipeline_path(tmp_path / "x.toml") == tmp_path / "x.toml"
    assert pipeline_path("specs/traffic") == Path("specs/traffic")


# --- reading user specs ------------------------------------------------------------------


def test_relative_model_paths_resolve_against_the_spec_file(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mine.onnx").write_bytes(Path(MODEL).read_bytes())
    mods = chain(1)
    mods[0]["model"] = "models/mine.onnx"
    spec = load_pipeline(write_spec(tmp_path, mods))
    assert spec.modules[0].model == tmp_path / "models" / "mine.onnx"


def test_optional_fields(tmp_path: Path) -> None:
    mods = chain(2)
    mods[0].update(batch_sizes=[1, 3, 9], input_shape=[1, 36, 36], description="first")
    spec = load_pipeline(write_spec(tmp_path, mods, description="mine", slo_ms=12.5))
    first, second = spec.modules
    assert (first.batch_sizes, first.input_shape) == ((1, 3, 9), (1, 36, 36))
    assert (second.batch_sizes, second.input_shape) == (DEFAULT_BATCH_SIZES, None)
    assert spec.slo_ms == 12.5


def test_toml_spec(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(
        f"""
name = "two"
slo_ms = 300

[[modules]]
name = "detect"
id = 10
model = '{MODEL}'
pres = []
subs = [20]

[[modules]]
name = "track"
id = 20
model = '{MODEL}'
pres = [10]
subs = []
batch_sizes = [1, 4]
"""
    )
    spec = load_pipeline(path)
    assert spec.paths() == (("10", "20"),)
    assert spec.module(20).batch_sizes == (1, 4)


def test_spec_errors_are_value_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read the pipeline spec"):
        load_pipeline(tmp_path / "absent.json")


def _mutate(mods: list[dict], index: int, **changes: Any) -> list[dict]:
    mods[index].update(changes)
    for key in [k for k, v in changes.items() if v is _DROP]:
        del mods[index][key]
    return mods


_DROP = object()

INVALID_MODULES = [
    # (modules, fragment the message must contain)
    (_mutate(chain(), 1, id=1), "module 'm2': id: 1 is already used by m1 (id 1)"),
    (_mutate(chain(), 1, name="m1"), "module m1 (id 2): name: already used by m1 (id 1)"),
    (_mutate(chain(), 1, pres=[]), "module m2 (id 2): pres: must list 1"),
    (_mutate(chain(), 0, subs=[]), "module m1 (id 1): subs: must list 2"),
    (_mutate(chain(), 2, subs=[9]), "module m3 (id 3): subs: no module has id 9"),
    (_mutate(chain(), 1, subs=[3, 2]), "module m2 (id 2): subs: lists the module itself"),
    (_mutate(chain(), 1, pres=[1, 1]), "modules[1] ('m2', id 2): pres: has duplicates"),
    (
        [*chain(2), module(3, [], [])],
        "exactly one module must have empty pres (the source); found m1 (id 1), m3 (id 3)",
    ),
    (
        # 2 and 3 feed each other: consistent, but nothing leads there from the source.
        [module(1, [], []), module(2, [3], [3]), module(3, [2], [2])],
        "module m2 (id 2): pres: not reachable from the source m1 (id 1)",
    ),
    (
        [module(1, [], [2]), module(2, [1, 3], [3]), module(3, [2], [2])],
        "subs: is on a cycle (m2 -> m3 -> m2)",
    ),
    (_mutate(chain(), 0, id="1"), "modules[0] ('m1', id 1): id: must be an integer, got '1'"),
    (_mutate(chain(), 0, id=True), "id: must be an integer, got True"),
    (_mutate(chain(), 0, name=""), "modules[0] ('', id 1): name: must be a non-empty string"),
    (_mutate(chain(), 0, model=_DROP), "model: must be a non-empty string, got None"),
    (_mutate(chain(), 1, model="nowhere.onnx"), "modules[1] ('m2', id 2): model: file "),
    (_mutate(chain(), 0, subs="2"), "subs: must be a list of integers, got '2'"),
    (_mutate(chain(), 0, batch_sizes=[4, 2]), "batch_sizes: must be positive and ascending"),
    (_mutate(chain(), 0, batch_sizes=[0, 2]), "batch_sizes: must be positive and ascending"),
    (_mutate(chain(), 0, batch_sizes=[]), "batch_sizes: must be positive and ascending"),
    (_mutate(chain(), 0, input_shape=[3, 0]), "input_shape: must be positive sizes, got [3, 0]"),
    (_mutate(chain(), 0, inputs=[1]), "modules[0] ('m1', id 1): unknown field(s) inputs"),
    ([*chain(2), "m3"], "modules[2]: a module must be an object, got str"),
]


@pytest.mark.parametrize(("modules", "fragment"), INVALID_MODULES)
def test_invalid_module_is_named_with_its_field(
    tmp_path: Path, modules: list[dict], fragment: str
) -> None:
    path = write_spec(tmp_path, modules)
    with pytest.raises(PipelineSpecError) as exc:
        load_pipeline(path)
    assert str(exc.value).startswith(f"{path}: ")
    assert fragment in str(exc.value)


@pytest.mark.parametrize(
    ("top", "fragment"),
    [
        ({"slo_ms": -1}, "slo_ms: must be a positive number of milliseconds, got -1"),
        ({"slo_ms": "400"}, "slo_ms: must be a positive number of milliseconds, got '400'"),
        ({"slo_ms": None}, "slo_ms: must be a positive number"),
        ({"name": 3}, "name: must be a non-empty string, got 3"),
        ({"modules": []}, "modules: must be a non-empty list, got []"),
        ({"deadline": 3}, "unknown field(s) deadline"),
    ],
)
def test_invalid_pipeline_field_is_named(tmp_path: Path, top: dict, fragment: str) -> None:
    with pytest.raises(PipelineSpecError) as exc:
        load_pipeline(write_spec(tmp_path, **top))
    assert fragment in str(exc.value)


def test_invalid_json_and_toml(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x",')
    with pytest.raises(PipelineSpecError, match=r"bad\.json: invalid JSON"):
        load_pipeline(bad)
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("name = ")
    with pytest.raises(PipelineSpecError, match=r"bad\.toml: invalid TOML"):
        load_pipeline(bad_toml)
    top_list = tmp_path / "list.json"
    top_list.write_text("[]")
    with pytest.raises(PipelineSpecError, match="the spec must be an object, got list"):
        load_pipeline(top_list)
