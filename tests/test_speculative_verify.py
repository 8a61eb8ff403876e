"""Verify of a bundle built for speculation without a draft model (lookahead): it passes as a plain bundle does, with
its verify-length graph among the checks, and says that no draft ran."""

from __future__ import annotations

from pathlib import Path

from mnnbuild.stages.verify import REPORT_JSON, REPORT_TEXT
from mnnbuild.verify.report import VerifyReport
from tests.conftest import TINY_MODEL_DIR, doit


def test_a_lookahead_bundle_verifies_its_verify_length_and_says_no_draft_ran(tmp_path: Path) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "tiny-look.toml").write_text(
        f'name = "tiny-look"\nsource = {{ local = "{TINY_MODEL_DIR}" }}\nchunk_size = 128\ntargets = ["v79"]\n'
        'speculative = "lookahead"\n'
    )
    doit(tmp_path, "verify:tiny-look-v79", env={"MNNBUILD_MODELS_PATH": str(specs)}, check=True)
    out = tmp_path / "artifacts" / "tiny-look" / "v79" / "verify"
    report = VerifyReport.model_validate_json((out / REPORT_JSON).read_text(encoding="utf-8"))
    assert report.passed
    # the engine's verify forward (draft_predict_length 3 + 1 rows) is io's sample of that length, and every graph
    # at that length ran in the simulator
    assert sorted(s.seq_len for s in report.whole_model) == [1, 4, 128] and all(s.passed for s in report.whole_model)
    rows = {g.outputs[0].shape[1] for g in report.graphs}  # a graph's first output: [1, rows, width]
    at_four = [g for g in report.graphs if g.outputs[0].shape[1] == 4]
    assert rows == {1, 4, 128} and len(at_four) == len(report.plugins)
    assert all(g.passed and g.fed == "bundle_pass" for g in at_four)
    spec = report.speculation
    assert spec is not None and spec.passed and spec.kind == "lookahead" and spec.verify_length == 4
    assert spec.note is not None and "no draft model" in spec.note and not spec.bundle_tokens
    assert "speculative decoding (lookahead)" in (out / REPORT_TEXT).read_text(encoding="utf-8")
