"""The export report's warnings and notes (one registry of kinds decides which is which), and its parity table:
one row per check behind the headline, so the headline number is always one of the rows."""
import pytest
import torch

from workbench import quant
from workbench.export import export_qdq_onnx
from workbench.export.notes import REPORT_KINDS, ReportLog, Severity
from workbench.quant.algorithms.calibrate import calibrate
from workbench.sources.demo import DigitsCNN


def calibrated(model, batches):
    model.eval()
    quant.replace_to_quantization_module(model)
    calibrate(model, batches, num_batches=len(batches), method="max", report_sqnr=False)
    return model


def headline_rows(report):
    return [row for row in report.checks if row.in_headline]


def assert_headline_in_table(report):
    rows = headline_rows(report)
    assert report.max_abs_diff == max(row.max_abs_diff for row in rows)
    assert report.cosine == min(row.cosine for row in rows)
    # every output of the sample has its own row; the other checks follow
    assert [row.output for row in rows if row.check == "sample inputs"] == report.output_names


def test_the_registry_sorts_entries_and_refuses_unknown_kinds():
    log = ReportLog()
    log.add("opset_conversion", "ReduceMean: removed noop_with_empty_axes")
    log.add("float_gemms", "1 of 2 weight GEMMs keep a float weight")
    log.add("float_gemms", "1 of 2 weight GEMMs keep a float weight")  # once
    assert log.notes == ["ReduceMean: removed noop_with_empty_axes"]
    assert log.warnings == ["1 of 2 weight GEMMs keep a float weight"]
    assert log.kinds == {"ReduceMean: removed noop_with_empty_axes": "opset_conversion",
                         "1 of 2 weight GEMMs keep a float weight": "float_gemms"}
    with pytest.raises(KeyError, match="unknown export report kind 'made_up'"):
        log.add("made_up", "text")
    assert REPORT_KINDS["use_cache_off"].severity is Severity.NOTE
    assert REPORT_KINDS["unreached_quantizers"].severity is Severity.WARNING


def test_demo_cnn_opset_conversion_is_a_note_and_every_check_has_a_row(tmp_path):
    torch.manual_seed(0)
    batches = [torch.rand(4, 1, 8, 8) for _ in range(2)]
    model = calibrated(DigitsCNN(), batches)
    report = export_qdq_onnx(model, batches[0], tmp_path / "cnn.onnx", exporter="dynamo")
    # torch.export writes opset 18; converted down to 17, whatever that needed is what the exporter did
    assert report.exporter == "dynamo" and report.opset == 17
    for note in report.notes:
        assert note not in report.warnings
        assert REPORT_KINDS[report.entry_kinds[note]].severity is Severity.NOTE
    for warning in report.warnings:
        assert REPORT_KINDS[report.entry_kinds[warning]].severity is Severity.WARNING
    # its global average pool: ReduceMean's noop_with_empty_axes (opset 18) removed at its default value
    assert any("ReduceMean: removed noop_with_empty_axes" in n for n in report.notes)
    assert not any("noop_with_empty_axes" in w for w in report.warnings)
    checks = [row.check for row in report.checks]
    # one run covers another batch size and the sample's range: random values at batch size 5
    assert checks[0] == "sample inputs" and "random inputs in the sample's range, batch size 5" in checks
    assert report.range_check == report.dynamic_batch_check and report.range_check.shape[0] == 5
    assert_headline_in_table(report)
    optimized = [row for row in report.checks if not row.in_headline]
    assert len(optimized) == 1 and "optimizations" in optimized[0].check
    assert optimized[0].max_abs_diff == report.optimized_check.max_abs_diff


def test_bert_sequence_checks_have_rows_and_use_cache_is_a_note(tmp_path):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=32, num_labels=3)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    model.config.use_cache = True  # as a checkpoint's config often says, even for a classifier
    generator = torch.Generator().manual_seed(0)
    batches = [{"input_ids": torch.randint(0, 64, (2, 8), generator=generator),
                "attention_mask": torch.ones(2, 8, dtype=torch.long)} for _ in range(2)]
    calibrated(model, batches)
    report = export_qdq_onnx(model, batches[0], tmp_path / "bert.onnx")
    assert any("use_cache=False" in n for n in report.notes)
    assert not any("use_cache" in w for w in report.warnings)
    checks = [row.check for row in report.checks]
    assert "sequence length 9" in checks and "batch size 3" in checks
    assert report.sequence_check is not None
    sequence_row = next(row for row in report.checks if row.check == "sequence length 9")
    assert sequence_row.max_abs_diff == report.sequence_check.max_abs_diff
    assert_headline_in_table(report)
