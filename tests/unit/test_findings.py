"""One ``Finding`` type for every checker: the draft doctor and the tokenizer comparison."""

from __future__ import annotations

import json

from testkit.tokenizers import write_kimi_tokenizer, write_variant
from vllm_kimi_ext.drafts.doctor import diagnose
from vllm_kimi_ext.findings import Finding
from vllm_kimi_ext.tokenizers import check_tokenizers


def test_to_dict_names_file_and_field_only_when_set():
    plain = Finding("E-X", "error", "m")
    assert plain.to_dict() == {"code": "E-X", "severity": "error", "message": "m"}
    where = Finding("E-X", "error", "m", file="config.json", field="vocab_size")
    assert where.to_dict() == {"code": "E-X", "severity": "error", "message": "m",
                               "file": "config.json", "field": "vocab_size"}
    assert str(where) == "ERROR E-X: m"


def test_doctor_and_tokenizer_check_report_the_shared_type(tmp_path):
    doctor = diagnose(tmp_path / "no-target", tmp_path / "no-draft")
    assert doctor.findings and all(type(f) is Finding for f in doctor.findings)
    target = write_kimi_tokenizer(tmp_path / "t", n_ranks=300)
    draft = write_variant(tmp_path / "d", "special_rename", n_ranks=300)
    report = check_tokenizers(target, draft)
    assert report.findings and all(type(f) is Finding for f in report.findings)
    # the tokenizer report keeps its published key order: severity, code, message
    first = json.loads(report.to_json())["findings"][0]
    assert list(first) == ["severity", "code", "message"]
