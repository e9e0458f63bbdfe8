"""The mutation suite: one planted bug per seed rule, each of which the property harness must catch.

Each mutant is applied with monkeypatch (a replaced method or rule), then the Engine state machine runs over the
ToyProgram with a fixed seed (derandomized, no shrinking) and must FAIL, and fail for the right reason: the message
names the broken rule. A mutant the harness lets through is a hole in the harness.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from ninfer.contracts import PendingBatch, RequestState, RowDecision
from ninfer.engine import admission, engine as engine_mod, failure, transitions
from ninfer.engine.core import EngineCore
from ninfer.engine.catalog_entry import SessionBinding
from ninfer.engine.resource_manager import ResourceManager
from ninfer.engine.scheduler import Scheduler, Unit
from ninfer.engine.units import CommittedOutput, UnitRunner
from ninfer.testing.harness import make_engine_machine
from ninfer.testing.hunts import fixed_constants
from ninfer.testing.toy_program import ToyProgram


def publish_before_commit(self, batch, recs, *, forced):
    """The OutputSession commits and the delta is published before the Program commits."""
    self.core.pending = batch
    previews, decisions = self._preview(batch, recs, forced)
    for row, rec, preview, decision in zip(batch.rows, recs, previews, decisions):
        self._after_commit(rec, row, preview, decision)
    self.core.program.commit(batch.take(), decisions)
    self.core.pending = None


_after_commit = UnitRunner._after_commit


def publish_final_row_at_once(self, rec, row, preview, decision):
    """A terminal row is published at its commit, before its retain or release result is adopted."""
    if preview is not None and decision.terminal:
        out = CommittedOutput.of(row, preview, decision.accepted)
        rec.output_tokens.extend(out.tokens)
        self._publish(rec, out)
        self.enter_terminal(rec, preview.finish_reason)
        return
    _after_commit(self, rec, row, preview, decision)


_preview = UnitRunner._preview


def _reshape(delta):
    def mutant(self, batch, recs, forced):
        previews, decisions = _preview(self, batch, recs, forced)
        out = []
        for row, d in zip(batch.rows, decisions):
            if not d.terminal and not d.cancelled:
                d = RowDecision(max(1, d.accepted + delta(row.produced)), d.terminal, boundary=d.boundary)
            out.append(d)
        return previews, out
    return mutant


accept_more_than_produced = _reshape(lambda produced: 1)
accept_less_on_nonterminal = _reshape(lambda produced: -1 if produced > 1 else 0)


def no_decision_check(self, decisions):
    """The accepted-prefix guard removed (both the Engine's and the Program's)."""


def release_on_either_fact(response_done, consumer_released, capacity_released):
    return response_done or consumer_released


def release_without_consumer(response_done, consumer_released, capacity_released):
    return response_done and not capacity_released


def lifo_enqueue(self, rid):
    self.waiting.appendleft(rid)
    self.admission_dirty = True


def leave_active_keeps_decode_row(self, rid):
    self._drop_staged(rid)
    if rid in self.control_ready:
        self.control_ready.remove(rid)


_finish = EngineCore.finish


def finish_drops_the_kept_row(self, rec, reason):
    """With leave_active_keeps_decode_row: the row goes only with the record, so the terminal request stays in the
    decode rounds from TerminalPending to its result, not past it (there the round's record lookup raises KeyError,
    which is a crash, not the harness seeing the rule broken)."""
    self.scheduler.decode_ready.pop(rec.rid, None)
    _finish(self, rec, reason)


_next_unit = Scheduler.next_unit


def prefill_first(self):
    if self.control_ready:
        return Unit("control", (self.control_ready[0],))
    if self.staged_prefill:
        rid = self.staged_prefill[0]
        self.staged_prefill.rotate(-1)
        return Unit("prefill", (rid,))
    return _next_unit(self)


def pad_decode_round(self):
    unit = _next_unit(self)
    if unit is not None and unit.kind == "decode":
        return Unit("decode", unit.requests + (unit.requests[0],) * (3 - len(unit.requests)))
    return unit


def decode_with_staged_prefill(self):
    unit = _next_unit(self)
    if unit is not None and unit.kind == "decode" and self.staged_prefill:
        return Unit("decode", unit.requests + tuple(self.staged_prefill))
    return unit


def backfill_without_proof(core, head, lane):
    for rid in list(core.scheduler.waiting)[1:]:
        rec = core.records[rid]
        if not rec.cancel_requested and admission._materialize(core, rec, lane, admission._choice(core, rec)):
            return True
    return False


def _boundary_in(order):
    """A worker boundary that runs its phases in `order` (names below) instead of the seed's."""
    def mutant(self):
        worked, cancelled = self._ingest(), frozenset()
        for phase in order:
            if phase == "expire":
                worked |= self._expire_waiting()
            elif phase == "advance":
                worked |= self._advance_transition()
            elif phase == "settle" and self.txn is None:
                worked |= self._start_settlement()
            elif phase == "snapshot":
                cancelled = self._cancellation_snapshot()
                worked |= self.units.end_cancelled(cancelled)
            elif phase in ("admit", "admit_open") and (self.txn is None or phase == "admit_open") \
                    and self.scheduler.admission_allowed(topology_open=False):
                worked |= self._try_admission()
            elif phase == "unit":
                if self.program.resource_revision != self._revision:
                    self._revision = self.program.resource_revision
                    self.scheduler.note_trigger()
                unit = self.scheduler.next_unit()
                if unit is not None:
                    self.units.run(unit, cancelled)
                    worked = True
        return worked
    return mutant


SEED_ORDER = ("expire", "advance", "settle", "snapshot", "admit", "unit")


def _cancellation_snapshot_without_deadline(self):
    return frozenset(r.rid for r in self.records.values() if r.cancel_requested and r.state in (
        RequestState.PREFILL, RequestState.DECODE_READY, RequestState.CONTROL_READY))


def no_cancellation_snapshot(self, cancelled):
    return False


def always_advance(self):
    if self.txn is None:
        return False
    result = self.program.advance(self.txn)
    if result is not None:
        self._adopt(result, aborted=False)
    return True


_expire = EngineCore._expire_waiting


def ignore_waiting_cancel(self):
    for rid in list(self.scheduler.waiting):
        self.records[rid].cancel_requested = False  # the flag is lost: a cancelled waiting request runs anyway
    return _expire(self)


def adopt_any_txn(self, result, *, aborted):
    """The stale transaction id check removed."""
    txn, owner = self.txn, self.txn_owner
    self.txn, self.txn_owner = None, None
    self.scheduler.note_trigger()
    transitions.adopt_result(self, dataclasses.replace(result, txn_id=txn.txn_id, kind=txn.plan.choice.kind),
                             owner, aborted=aborted)


_terminal_choice = ResourceManager.terminal_choice


def retain_even_unsuccessful(self, handle, facts):
    return _terminal_choice(self, handle, dataclasses.replace(facts, session_key=facts.session_key or "a",
                                                              succeeded=True))


def rebind_by_any_order(self, key, cid, order):
    self.sessions[key] = SessionBinding(cid, order)


def find_source_without_digest(self, prompt, session_key):
    best = None
    for entry in self.catalog.values():
        if 0 < entry.info.tokens < len(prompt) and (best is None or entry.info.tokens > best.info.tokens):
            best = entry
    return best if self.prefix_caching else None


_after_materialize = transitions._after_materialize


def shortfall_rejects(core, result, rec, aborted):
    """A shortfall after the plan was sealed is downgraded to a request-level rejection."""
    return _after_materialize(core, result, rec, aborted or not result.succeeded)


def cleanup_keeps_the_batch(core):
    if core.txn is not None:
        txn, core.txn, core.txn_owner = core.txn, None, None
        failure._attempt("abort", lambda: core.program.abort(txn))
    core.pending = None


_complete = failure._complete_responses


def complete_only_waiting(core):
    core.records = {rid: r for rid, r in core.records.items() if r.state is RequestState.WAITING}
    _complete(core)


def _toy(**kw):
    return lambda: ToyProgram(**{"max_concurrency": 3, "total_pages": 32, "checkpoint_slots": 4,
                                 "source_stages": 3, **kw})


def machine(factory=None, session_keys=(None, "a", "b"), **kw):
    return make_engine_machine(factory or _toy(), faults=bool(kw), session_keys=session_keys, **kw)


TOY = machine()
SPEC = machine(_toy(total_pages=40, page_size=3, draft_tokens=3))
TIGHT = machine(_toy(total_pages=14))  # the head is often blocked with a lane free: backfill is tried
ONE_SESSION = machine(session_keys=("a",))  # every request continues one conversation: retains race
SLOW_SOURCE = machine(_toy(source_stages=10, root_stages=4))  # materializations stay open for 3 to 9 boundaries
# one conversation whose materializations stay open: a later request's retain often completes before an earlier one's
SLOW_SESSION = machine(_toy(source_stages=10, root_stages=4), session_keys=("a",))
CORRUPT_BATCH = machine(fault_methods=("prefill", "decode"), fault_modes=("corrupt",))
STALE_TXN = machine(fault_methods=("advance",), fault_modes=("corrupt",), fault_variants=(0,))
SHORTFALL = machine(fault_methods=("advance",), fault_modes=("corrupt",), fault_variants=(4,))
RAISE = machine(fault_methods=("decode", "prefill"), fault_modes=("raise",))

# name -> (patches [(owner, attribute, replacement)], machine, what the harness must say)
MUTANTS = {
    "publish_before_program_commit": ([(UnitRunner, "_commit", publish_before_commit)], TOY,
                                      ("PendingBatch", "delta published before commit")),
    "publish_final_before_terminal_result": ([(UnitRunner, "_after_commit", publish_final_row_at_once)], TOY,
                                             ("before the terminal result", "before its resource result",
                                              "before its sequence was retained")),
    "accept_more_than_produced": ([(UnitRunner, "_preview", accept_more_than_produced),
                                   (PendingBatch, "check_decisions", no_decision_check)], TOY,
                                  ("tokens of a row that produced",)),
    "accept_less_on_nonterminal_rows": ([(UnitRunner, "_preview", accept_less_on_nonterminal),
                                         (PendingBatch, "check_decisions", no_decision_check)], SPEC,
                                        ("delta published before commit", "output depends on the schedule")),
    "release_capacity_twice": ([(engine_mod, "should_release_capacity", release_on_either_fact)], TOY,
                               ("outstanding", "capacity not released")),
    "release_capacity_before_consumer": ([(engine_mod, "should_release_capacity", release_without_consumer)], TOY,
                                         ("outstanding",)),
    "lifo_waiting_queue": ([(Scheduler, "enqueue", lifo_enqueue)], TOY, ("FIFO head",)),
    "backfill_without_proof": ([(admission, "_try_backfill", backfill_without_proof)], TIGHT,
                               ("without a backfill proof",)),
    "pad_decode_round_to_max_concurrency": ([(Scheduler, "next_unit", pad_decode_round)], TOY,
                                            ("more than once",)),
    "decode_round_with_staged_prefill": ([(Scheduler, "next_unit", decode_with_staged_prefill)], TOY,
                                         ("not decode-ready", "engine failed without an injected fault")),
    # a cancelled request is terminal too: kept in the rounds, it is seen running in a unit after its cancellation
    "terminal_request_stays_in_decode_round": ([(Scheduler, "leave_active", leave_active_keeps_decode_row),
                                                (EngineCore, "finish", finish_drops_the_kept_row)], ONE_SESSION,
                                               ("not decode-ready", "after it was cancelled or expired")),
    "prefill_starves_decode": ([(Scheduler, "next_unit", prefill_first)], TOY, ("decode starved",)),
    "skip_abort_on_cancel_in_materializing": ([(EngineCore, "_advance_transition", always_advance)], SLOW_SOURCE,
                                              ("advanced, not aborted",)),
    "no_active_cancellation": ([(UnitRunner, "end_cancelled", no_cancellation_snapshot)], TOY,
                               ("after it was cancelled or expired",)),
    "deadline_ignored_while_active": ([(EngineCore, "_cancellation_snapshot",
                                        _cancellation_snapshot_without_deadline)], TOY,
                                      ("after it was cancelled or expired",)),
    "waiting_cancellation_ignored": ([(EngineCore, "_expire_waiting", ignore_waiting_cancel)], TOY,
                                     ("after it was cancelled or expired",)),
    "admission_before_settlement": ([(EngineCore, "_boundary", _boundary_in(
        ("expire", "advance", "admit", "settle", "snapshot", "unit")))], TOY, ("phase settle after admit",)),
    "unit_before_transition_advance": ([(EngineCore, "_boundary", _boundary_in(
        ("expire", "unit", "advance", "settle", "snapshot", "admit")))], TOY,
        ("phase", "after it was cancelled or expired")),
    "admission_while_a_transition_is_open": ([(EngineCore, "_boundary", _boundary_in(
        ("expire", "advance", "settle", "snapshot", "admit_open", "unit")))], TOY,
        ("while one is open", "engine failed without")),
    "two_units_per_boundary": ([(EngineCore, "_boundary", _boundary_in(SEED_ORDER + ("unit",)))], TOY,
                               ("two model units", "two batches", "phase run after commit")),
    "retain_unsuccessful_request": ([(ResourceManager, "terminal_choice", retain_even_unsuccessful)], TOY,
                                    ("was retained",)),
    "rebind_session_by_older_publication": ([(ResourceManager, "_bind_session", rebind_by_any_order)],
                                            SLOW_SESSION, ("replaced the binding",)),
    "prefix_match_without_digest": ([(ResourceManager, "find_source", find_source_without_digest)], TOY,
                                    ("output depends on the schedule",)),
    "stale_transaction_id_accepted": ([(EngineCore, "_adopt", adopt_any_txn)], STALE_TXN,
                                      ("proceeded on a corrupted",)),
    "shortfall_downgraded_to_rejection": ([(transitions, "_after_materialize", shortfall_rejects)], SHORTFALL,
                                          ("proceeded on a corrupted",)),
    "failure_cleanup_keeps_the_batch": ([(failure, "_abort_open_transactions", cleanup_keeps_the_batch)],
                                        CORRUPT_BATCH, ("PendingBatch was left unconsumed",)),
    "failure_cleanup_forgets_active_requests": ([(failure, "_complete_responses", complete_only_waiting)], RAISE,
                                                ("never finished", "capacity not released")),
}

HUNT = settings(max_examples=200, stateful_step_count=40, deadline=None, database=None, derandomize=True,
                phases=[Phase.generate], suppress_health_check=list(HealthCheck), print_blob=False)


def test_the_suite_covers_at_least_twenty_rules():
    assert len(MUTANTS) >= 20


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_harness_catches_mutant(name, monkeypatch):
    patches, hunted, symptoms = MUTANTS[name]
    for owner, attr, bug in patches:
        monkeypatch.setattr(owner, attr, bug)
    with pytest.raises(Exception) as caught, fixed_constants():  # noqa: PT011 - any failure, checked by its message
        run_state_machine_as_test(hunted, settings=HUNT)
    assert any(s in str(caught.value) for s in symptoms), f"{name}: caught for another reason: " \
                                                         f"{type(caught.value).__name__}: {str(caught.value)[:400]}"


HUNTED = {"toy": TOY, "one_session": ONE_SESSION, "spec": SPEC, "tight": TIGHT, "slow_source": SLOW_SOURCE,
          "slow_session": SLOW_SESSION, "corrupt_batch": CORRUPT_BATCH, "stale_txn": STALE_TXN, "shortfall": SHORTFALL,
          "raise": RAISE}


@pytest.mark.parametrize("name", sorted(HUNTED))
def test_the_unmutated_engine_passes_each_hunt(name):
    """The same machines without a mutant pass (fewer examples: the long runs are test_engine_properties)."""
    with fixed_constants():
        run_state_machine_as_test(HUNTED[name], settings=settings(HUNT, max_examples=12))
