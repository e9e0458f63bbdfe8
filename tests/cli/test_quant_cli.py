"""`ninfer convert --quantize` and an imported quantized checkpoint, inspected and generated from on the reference
Program (which dequantizes every representation exactly into fp32)."""

from __future__ import annotations

import pytest
import torch

from ninfer.testing.checkpoints import make_hf_checkpoint
from ninfer.testing.quant_checkpoints import make_quantized_checkpoint

from cli_helpers import SMALL

# The real Qwen3.5 vocabulary (the built-in tokenizer), as the CLI's own checkpoint fixture.
QWEN = dict(vocab=248320, tie=True, mtp=False, tokenizer=False)


@pytest.mark.parametrize("source, args, representation", [
    ("bf16", ["--quantize", "q4", "--group-size", "32", "--keep", "layers.0.*"], "int_group/int4 [group_size=32]"),
    ("bf16", ["--quantize", "fp8"], "fp8_e4m3/float8_e4m3fn [block=[128, 128]]"),
    ("gptq", [], "int_group/int4 [act_order=True,group_size=32,zero_point=True]"),
    ("modelopt", [], "nvfp4/nvfp4 [input_scale=True]"),
])
def test_quantized_artifact_inspects_and_generates(run, tmp_path, source, args, representation):
    src = (make_hf_checkpoint(tmp_path / "src", dtype=torch.bfloat16, **QWEN) if source == "bf16"
           else make_quantized_checkpoint(tmp_path / "src", source, base=QWEN))
    out = tmp_path / "m.ninfer"
    converted = run("convert", str(src), str(out), "--no-progress", *args)
    assert converted.exit_code == 0, converted.output
    shown = run("inspect", str(out)).output
    assert "representation by module kind:" in shown and representation in shown
    generated = run("generate", "Hello", "-n", "4", "--no-think", "--model", str(out), "--program", "reference",
                    *SMALL)
    assert generated.exit_code == 0, generated.output
    assert "4 generated" in generated.stderr


def test_convert_refuses_an_unknown_recipe(run, tmp_path):
    src = make_hf_checkpoint(tmp_path / "src", dtype=torch.bfloat16)
    result = run("convert", str(src), str(tmp_path / "m.ninfer"), "--quantize", "q3")
    assert result.exit_code == 2 and "'q3' is not one of" in result.output


def test_the_recipe_table_owns_the_cli_choices(run):
    """One list of recipe names: the CLI offers exactly those the table builds, and reading them imports neither
    numpy nor torch (`ninfer --help` stays instant)."""
    import subprocess
    import sys

    from ninfer.convert.quant.recipes import RECIPES, recipe

    assert all(recipe(name).name == name for name in RECIPES)
    shown = run("convert", "--help").output
    assert "[" + "|".join(RECIPES) + "]" in shown.replace("\n", "").replace(" ", "")
    probe = "import sys, ninfer.cli; assert not {'numpy', 'torch'} & set(sys.modules), sorted(sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0
