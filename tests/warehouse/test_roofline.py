"""GPU sheets: the default's figures with their sources, the precision MFU is measured at, and every
mistake refused with its file, line and key."""

from __future__ import annotations

import pytest

from warehouse.roofline import PEAK_KEYS, VALUE_KEYS, GpuSheetError, default_sheet, load_sheet, parse_sheet

GOOD = """name = "test"
[[gpu]]
model = "NVIDIA GB300"
dense_fp4_flops_per_second = 15.0e15
dense_fp8_flops_per_second = 5.0e15
hbm_bytes_per_second = 8.0e12
memory_bytes = 288.0e9
[gpu.sources]
dense_fp4_flops_per_second = "datasheet"
dense_fp8_flops_per_second = "datasheet"
hbm_bytes_per_second = "datasheet"
memory_bytes = "datasheet"

[[model]]
name = "deepseek-ai/DeepSeek-V4.1-Flash"
precision = "fp4"
source = "checkpoint"
"""


def test_the_default_sheet_has_each_gpu_dense_with_a_source_for_every_value() -> None:
    s = default_sheet()
    assert [g.model for g in s.gpus] == [
        "NVIDIA GB300",
        "NVIDIA GB200",
        "NVIDIA B200",
        "NVIDIA H200",
        "NVIDIA H100 80GB HBM3",
    ]
    gb300 = s.gpu("NVIDIA GB300")
    assert gb300.peaks == {"fp4": 15.0e15, "fp8": 5.0e15, "bf16": 2.5e15}
    assert (gb300.hbm_bytes_per_second, gb300.memory_bytes) == (8.0e12, 288.0e9)
    assert gb300.ridge("fp4") == 1875.0  # FLOP/byte where the FP4 roof meets the bandwidth roof
    assert "15 PetaFLOPS dense NVFP4" in gb300.sources["dense_fp4_flops_per_second"]
    for g in s.gpus:
        assert set(g.sources) == {k for k in VALUE_KEYS if k not in PEAK_KEYS.values()} | {
            PEAK_KEYS[p] for p in g.peaks
        }
        assert all("http" in text for text in g.sources.values()), g.model
    assert s.gpu("NVIDIA H200").peak("fp4") is None  # Hopper has no FP4 tensor cores
    assert s.gpu("NVIDIA H100 80GB HBM3").peaks == {"fp8": 1.979e15, "bf16": 0.9895e15}  # half the "with sparsity"


def test_deepseek_v4_flash_is_measured_at_fp4_on_blackwell_and_fp8_on_hopper() -> None:
    s = default_sheet()
    for model in ("deepseek-ai/DeepSeek-V4.1-Flash", "deepseek-ai/DeepSeek-V4-Flash"):
        a = s.assumed(model, s.gpu("NVIDIA GB300"))
        assert (a.precision, a.peak_flops_per_second, a.model_precision) == ("fp4", 15.0e15, "fp4")
        h = s.assumed(model, s.gpu("NVIDIA H200"))
        assert (h.precision, h.peak_flops_per_second) == ("fp8", 1.979e15)
        assert h.reason.startswith("NVIDIA H200 has no FP4 tensor cores: its FP8 peak.")
    other = s.assumed("Qwen/Qwen3-8B", s.gpu("NVIDIA GB200"))  # the "*" entry
    assert (other.precision, other.peak_flops_per_second) == ("bf16", 2.5e15)
    asked = s.assumed("deepseek-ai/DeepSeek-V4.1-Flash", s.gpu("NVIDIA GB300"), "fp8")
    assert (asked.precision, asked.model_precision, asked.reason) == ("fp8", "fp4", "FP8 asked for")


def test_a_gpu_is_found_by_dcgms_name_or_an_alias_case_aside_and_an_unknown_one_is_named() -> None:
    s = parse_sheet(GOOD.replace("memory_bytes = 288.0e9\n", 'memory_bytes = 288.0e9\naliases = ["GB300 SXM"]\n'))
    assert s.find(" nvidia gb300 ") is s.find("GB300 SXM") is s.gpus[0]
    with pytest.raises(GpuSheetError, match=r"no \[\[gpu\]\] entry for GPU model 'NVIDIA H20'.*'NVIDIA GB300'"):
        s.gpu("NVIDIA H20")
    with pytest.raises(GpuSheetError, match=r"no \[\[model\]\] entry for 'x' and no '\*' entry"):
        s.assumed("x", s.gpus[0])
    with pytest.raises(GpuSheetError, match="unknown precision 'int8'"):
        s.assumed("deepseek-ai/DeepSeek-V4.1-Flash", s.gpus[0], "int8")
    no_wider = parse_sheet(GOOD.replace('precision = "fp4"', 'precision = "bf16"'))
    with pytest.raises(GpuSheetError, match="has no peak at BF16 or any wider precision"):
        no_wider.assumed("deepseek-ai/DeepSeek-V4.1-Flash", no_wider.gpus[0])


FP4 = "dense_fp4_flops_per_second = 15.0e15"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (GOOD.replace(FP4, "dense_fp4_flops_per_second = -15.0e15"), "dense_fp4_flops_per_second must be a finite number above 0, got -1.5e+16"),
        (GOOD.replace(FP4, "dense_fp4_flops_per_second = 0"), "must be a finite number above 0, got 0"),
        (GOOD.replace(FP4, "dense_fp4_flops_per_second = nan"), "got nan"),
        (GOOD.replace(FP4, "dense_fp4_flops_per_second = inf"), "got inf"),
        (GOOD.replace(FP4, "dense_fp4_flops_per_second = true"), "got True"),
        (GOOD.replace(FP4, 'dense_fp4_flops_per_second = "15 PFLOPS"'), "got '15 PFLOPS'"),
        (GOOD.replace(FP4, "dense_fp4_flops_per_second = 15"), "dense_fp4_flops_per_second = 15 is outside 1e+12..1e+18 FLOP/s per GPU; write the value in FLOP/s"),
        (GOOD.replace(FP4, "dense_fp4_flops_per_second = 15.0e21"), "is outside 1e+12..1e+18 FLOP/s"),
        (GOOD.replace("hbm_bytes_per_second = 8.0e12", "hbm_bytes_per_second = 8.0e15"), "hbm_bytes_per_second = 8e+15 is outside 1e+11..1e+15 bytes/s"),
        (GOOD.replace("memory_bytes = 288.0e9", "memory_bytes = 288"), "memory_bytes = 288 is outside 1e+09..1e+13 bytes"),
        (GOOD.replace("hbm_bytes_per_second = 8.0e12\n", ""), "line 2 ([[gpu]] entry 1), NVIDIA GB300: hbm_bytes_per_second is missing"),
        (GOOD.replace(FP4 + "\n", "").replace("dense_fp8_flops_per_second = 5.0e15\n", ""), "no dense peak"),
        (GOOD.replace(FP4, "dense_fp4_flops_per_second = 4.0e15"), "dense_fp4_flops_per_second (4e+15) is below dense_fp8_flops_per_second (5e+15)"),
        (GOOD.replace('dense_fp8_flops_per_second = "datasheet"\n', ""), "line 2 ([[gpu]] entry 1), NVIDIA GB300: dense_fp8_flops_per_second has no source"),
        (GOOD.replace('hbm_bytes_per_second = "datasheet"', 'hbm_bytes_per_second = ""'), "sources.hbm_bytes_per_second must be a non-empty string"),
        (GOOD.replace('memory_bytes = "datasheet"', 'memory_bytes = "datasheet"\ndense_bf16_flops_per_second = "x"'), "sources for values the entry does not give: ['dense_bf16_flops_per_second']"),
        (GOOD.split("[gpu.sources]")[0] + GOOD.split('memory_bytes = "datasheet"\n')[1], "sources is missing"),
        (GOOD.replace('model = "NVIDIA GB300"\n', ""), "line 2 ([[gpu]] entry 1): model must be a non-empty string, got None"),
        (GOOD.replace(FP4, FP4 + "\ndense_fp4_sparse_flops_per_second = 30.0e15"), "unknown keys ['dense_fp4_sparse_flops_per_second']"),
        (GOOD.replace('model = "NVIDIA GB300"', 'model = "NVIDIA GB300"\naliases = "GB300"'), "aliases must be a list of names"),
        (GOOD + "\n" + GOOD[GOOD.index("[[gpu]]") : GOOD.index("[[model]]")], "line 19 ([[gpu]] entry 2): 'NVIDIA GB300' already names an earlier [[gpu]] entry"),
        (GOOD.replace('precision = "fp4"', 'precision = "nvfp4"'), "line 14 ([[model]] entry 1), deepseek-ai/DeepSeek-V4.1-Flash: precision must be one of fp4, fp8, bf16, got 'nvfp4'"),
        (GOOD.replace('source = "checkpoint"\n', ""), "source is missing (say why the model runs at fp4)"),
        (GOOD + GOOD[GOOD.index("[[model]]") :], "line 18 ([[model]] entry 2): a second entry for model"),
        ('name = "x"\n', "no [[gpu]] entries"),
        ("[[gpu]\n", "not valid TOML"),
        (GOOD + "discount = 1\n", "[[model]] entry 1): unknown keys ['discount']"),
        ("gpu = 3\n", "gpu must be an array of tables ([[gpu]])"),
        ("vendor = 'nvidia'\n" + GOOD, "unknown keys ['vendor']; a sheet has name, [[gpu]] and [[model]]"),
    ],
)  # fmt: skip
def test_mistakes_are_refused_with_the_file_the_entry_and_the_key(text: str, message: str) -> None:
    with pytest.raises(GpuSheetError) as err:
        parse_sheet(text, "gpus.toml")
    assert message in str(err.value) and str(err.value).startswith("gpus.toml"), str(err.value)


def test_a_sheet_that_cannot_be_read_says_which_file(tmp_path) -> None:
    with pytest.raises(GpuSheetError, match=r"cannot read GPU sheet .*missing\.toml"):
        load_sheet(tmp_path / "missing.toml")
    good = tmp_path / "mine.toml"
    good.write_text(GOOD)
    assert load_sheet(good).origin == str(good)
