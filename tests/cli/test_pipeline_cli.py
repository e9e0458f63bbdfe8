"""`--devices` and `--stage-layers` (docs/pipeline.md): the embedded model cut into CPU stages generates what one
stage generates (the reference Program plain and with MTP, the fast Program with its naive kernels; seeded sampled
runs, since the random model's greedy text is a run of newlines); bad device lists and splits fail at start, naming
the flag."""

from __future__ import annotations

from cli_helpers import SMALL

# a seeded sampled run: the random model's greedy text is a run of newlines, which a stage whose KV plane is never
# written still generates
SAMPLED = ("generate", "Hello", "--no-think", "--temperature", "1.0", "--seed", "3")
MTP = ("-n", "4", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}')  # sampled rounds are slow


def test_cpu_stages_generate_what_one_stage_generates(run):
    plain = run(*SAMPLED, "-n", "8", *SMALL)
    split = run(*SAMPLED, "-n", "8", "--devices", "cpu,cpu,cpu", "--stage-layers", "1,2,1", *SMALL)
    # sampled speculation keeps the distribution, not the tokens: MTP over two stages against MTP on one
    mtp, staged = run(*SAMPLED, *MTP, *SMALL), run(*SAMPLED, "--devices", "cpu,cpu", *MTP, *SMALL)
    for r in (plain, split, mtp, staged):
        assert r.exit_code == 0, r.output
    assert plain.stdout.strip() and split.stdout == plain.stdout
    assert mtp.stdout.strip() and staged.stdout == mtp.stdout and "speculative mtp (k=2)" in staged.stderr
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


def test_fast_cpu_stages_generate_what_one_fast_stage_generates(run):
    """`--program fast --devices cpu,cpu`: the fast Program's stage code with the naive kernels on the CPU."""
    sampled = (*SAMPLED, "-n", "8", "--program", "fast", *SMALL)
    one, two, split = (run(*sampled, "--devices", "cpu"), run(*sampled, "--devices", "cpu,cpu"),
                       run(*sampled, "--devices", "cpu,cpu,cpu", "--stage-layers", "1,2,1"))
    for r in (one, two, split):
        assert r.exit_code == 0, r.output
    assert one.stdout.strip() and two.stdout == one.stdout == split.stdout
    assert "generation on the fast Program" in split.stderr and "stages cpu,cpu,cpu: 1,2,1 layers" in split.stderr
