"""`--devices` and `--stage-layers` (docs/pipeline.md): the embedded model cut into CPU stages generates what one
stage generates (plain and with MTP); bad device lists and splits fail at start, naming the flag."""

from __future__ import annotations

from cli_helpers import SMALL

GREEDY = ("generate", "Hello", "-n", "6", "--no-think", "--temperature", "0")


def test_cpu_stages_generate_what_one_stage_generates(run):
    plain = run(*GREEDY, *SMALL)
    staged = run(*GREEDY, "--devices", "cpu,cpu", *SMALL)
    split = run(*GREEDY, "--devices", "cpu,cpu,cpu", "--stage-layers", "1,2,1", *SMALL)
    mtp = run(*GREEDY, "--devices", "cpu,cpu", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}',
              *SMALL)
    for r in (plain, staged, split, mtp):
        assert r.exit_code == 0, r.output
    assert staged.stdout == plain.stdout == split.stdout == mtp.stdout
    assert "stages cpu,cpu,cpu: 1,2,1 layers" in split.stderr and "stages" not in plain.stderr


def test_bad_device_lists_and_splits_fail_cleanly(run):
    cases = [(("--devices", "0,gpu"), "'gpu' is not a device"),
             (("--stage-layers", "2,2"), "with one device there is one stage"),
             (("--devices", "cpu,cpu", "--stage-layers", "9,1"), "must be >= 1 layer each and sum to"),
             (("--devices", "cpu,cpu", "--stage-layers", "a,b"), "comma-separated layer counts"),
             (("--devices", "0,0", "--program", "reference"), "the reference Program's stages run on the CPU")]
    for flags, message in cases:
        r = run("generate", "x", *flags, *SMALL)
        assert r.exit_code == 2 and message in r.stderr, (flags, r.stderr)
    assert "--devices" in run("serve", "--help").output


def test_cuda_stages_are_planned_per_device_then_refused(default_model, monkeypatch):
    """`--devices 0,1` on the fast Program: the plan and each device's capacity are checked with the real capacity
    queries (budgets stand in for the GPUs here), then the start is refused until the fast Program runs stages."""
    import pytest

    from ninfer.errors import UnavailableError
    from ninfer.pipeline import StageCapacityError
    from ninfer.pipeline import budgets
    from ninfer.runtime_options import RuntimeOptions
    from ninfer.wiring import _refuse_fast_stages

    options = RuntimeOptions(devices=("cuda:0", "cuda:1"))
    monkeypatch.setattr(budgets, "device_budgets", lambda devices, utilization: [1 << 30, 1 << 30])
    with pytest.raises(UnavailableError, match=r"fit \(\d+ KV pages per device\).*one device so far") as fits:
        _refuse_fast_stages(default_model, options, None)
    assert fits.value.where == "--devices"
    monkeypatch.setattr(budgets, "device_budgets", lambda devices, utilization: [1 << 30, 1000])
    with pytest.raises(StageCapacityError, match=r"cuda:0 \(ranks 0\): \d+ bytes.*cuda:1 \(ranks 1\): \d+ bytes .* "
                                                 r"1000 available"):
        _refuse_fast_stages(default_model, options, None)
