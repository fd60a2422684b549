"""Processes sharing one study (omnitune.search.study), with the interleavings that used to crash
a live process made to happen deterministically: a process starting up while another has just
asked a trial and not claimed it yet, and a trial failed under a live process while it asks,
claims or tells it.

What another process does is done here through the same storage, at the exact moment the hook
chooses, so every interleaving runs every time.
"""

from __future__ import annotations

import datetime
import os
import socket
from collections import Counter

import optuna
import pytest
from optuna.trial import TrialState

from omnitune.search import study as study_module
from omnitune.search.space import ConfigSpace
from omnitune.search.study import OWNERLESS_GRACE_S, Ledger, SharedStudy, abandoned
from omnitune.store import config_json
from omnitune.trial import TrialStatus
from test_search_driver import (
    TOY_SPEC,
    VALID,
    FakeRunner,
    _dead_pid,
    assert_each_config_measured_once,
    load_study,
    search,
)

optuna.logging.set_verbosity(optuna.logging.WARNING)
SPACE = ConfigSpace(TOY_SPEC)


@pytest.fixture
def storage_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'studies.optuna.db'}"


def measured_configs(study: optuna.Study) -> Counter:
    """How often each config was measured, read from the storage."""
    from omnitune.store import result_from_attrs

    counts = Counter()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        result = result_from_attrs(trial.user_attrs)
        if result is not None and result.status is not TrialStatus.PRUNED and "duplicate_of" not in trial.user_attrs:
            counts[result.config] += 1
    return counts


# --- a process starting up beside a live one ------------------------------------------------------


def test_a_process_starting_up_leaves_alone_a_trial_another_has_just_asked(storage_url):
    search(FakeRunner(), storage_url, trials=3, sampler="grid")
    other = load_study(storage_url)  # the live process's own handle on the study
    asked = other.ask(SPACE.distributions)  # asked, not claimed yet: no owner, no config
    claimed_config = VALID[-1]

    class LiveProcessClaimsMidway(FakeRunner):
        def measure(self, config):
            if len(self.calls) == 2:
                # The live process goes on: it claims its trial and measures it. Had the
                # starting process failed the trial, these calls would raise.
                asked.set_user_attr("owner", f"{socket.gethostname()}:{os.getppid()}")
                asked.set_user_attr("config_json", config_json(claimed_config))
                asked.set_user_attr("status", "ok")
                asked.set_user_attr("time_ms", 5.0)
                other.tell(asked, 5.0)
            return super().measure(config)

    runner = LiveProcessClaimsMidway()
    outcome = search(runner, storage_url, trials=10, sampler="grid")
    study = load_study(storage_url)
    assert study.trials[asked.number].state is TrialState.COMPLETE  # never failed under the live process
    assert claimed_config not in runner.calls
    # The budget is the study's: the live process's trial counts, and nothing is measured twice.
    assert outcome.measured_total == 10 and outcome.measured_now == 10 - 3 - 1
    assert sum(measured_configs(study).values()) == 10 and max(measured_configs(study).values()) == 1


def test_a_trial_left_without_an_owner_is_failed_once_the_grace_period_is_over(storage_url, monkeypatch):
    search(FakeRunner(), storage_url, trials=3, sampler="grid")
    orphan = load_study(storage_url).ask(SPACE.distributions)  # its process died before claiming it
    monkeypatch.setattr(study_module, "OWNERLESS_GRACE_S", 0.3)
    # The budget's last place waits for the orphan's claim, which never comes: after the grace
    # period it is failed, and the search measures the budget itself.
    outcome = search(FakeRunner(), storage_url, trials=len(VALID), sampler="grid")
    assert load_study(storage_url).trials[orphan.number].state is TrialState.FAIL
    assert outcome.measured_total == len(VALID)


def _running(number: int, *, owner=None, started_s_ago: float) -> optuna.trial.FrozenTrial:
    attrs = {"owner": owner} if owner is not None else {}
    return optuna.trial.FrozenTrial(
        number=number, state=TrialState.RUNNING, value=None, values=None,
        datetime_start=datetime.datetime(2026, 1, 1, 12, 0, 0) - datetime.timedelta(seconds=started_s_ago),
        datetime_complete=None, params={}, distributions={}, user_attrs=attrs, system_attrs={},
        intermediate_values={}, trial_id=number,
    )


def test_which_running_trials_count_as_abandoned():
    now = datetime.datetime(2026, 1, 1, 12, 0, 0)
    here = socket.gethostname()
    young = _running(0, started_s_ago=1.0)
    old = _running(1, started_s_ago=OWNERLESS_GRACE_S + 1)
    ahead = _running(2, started_s_ago=-3600.0)  # its host's clock runs an hour ahead of this one's
    dead = _running(3, owner=f"{here}:{_dead_pid()}", started_s_ago=0.0)
    mine = _running(4, owner=f"{here}:{os.getpid()}", started_s_ago=0.0)
    elsewhere = _running(5, owner="another-host:1", started_s_ago=1e6)
    running = [young, old, ahead, dead, mine, elsewhere]

    def found(seen_since=None, **kwargs):
        return [t.number for t in abandoned(running, seen_since or {}, now=now, monotonic_now=100.0, **kwargs)]

    assert found(self_is_gone=False) == [1, 3]
    assert found(self_is_gone=True) == [1, 3, 4]  # starting up: nothing of this process is in flight
    # Seen without an owner for longer than the grace period: abandoned, whatever its clock says.
    assert found({2: 100.0 - OWNERLESS_GRACE_S - 1, 0: 99.0}, self_is_gone=False) == [1, 2, 3]


# --- a trial failed under a live process ----------------------------------------------------------


def _fail_under_it(monkeypatch, method: str, *, name: str, calls: set[int]):
    """Make "another process" fail the trial that RDBStorage.<method> is called for with `name`
    (a param's or a user attr's), on the numbered such calls, before the call goes on."""
    real = getattr(optuna.storages.RDBStorage, method)
    fail = optuna.storages.RDBStorage.set_trial_state_values
    seen: list[int] = []

    def hooked(self, trial_id, *args, **kwargs):
        if (args[0] if args else kwargs.get("key")) == name:
            seen.append(trial_id)
            if len(seen) in calls:
                fail(self, trial_id, TrialState.FAIL)
        return real(self, trial_id, *args, **kwargs)

    monkeypatch.setattr(optuna.storages.RDBStorage, method, hooked)
    return seen


@pytest.mark.parametrize("moment", ["while it is asked", "before it is claimed"])
def test_a_live_process_whose_trial_is_failed_under_it_asks_again(storage_url, monkeypatch, moment):
    if moment == "while it is asked":
        # Between the trial's creation and its params: Optuna's ask raises UpdateFinishedTrialError.
        # (Optuna's cached storage writes params through the RDB storage's _set_trial_param.)
        _fail_under_it(monkeypatch, "_set_trial_param", name="BLOCK_M", calls={2, 5})
    else:
        _fail_under_it(monkeypatch, "set_trial_user_attr", name="owner", calls={2, 5})
    runner = FakeRunner()
    outcome = search(runner, storage_url, trials=8, sampler="tpe", seed=2)
    assert outcome.measured_total == 8 == len(runner.calls)
    assert_each_config_measured_once(runner.calls)
    study = load_study(storage_url)
    assert Counter(t.state for t in study.trials)[TrialState.FAIL] >= 2


def test_a_claim_on_a_trial_failed_under_it_lets_the_trial_go(storage_url):
    """The tells of a claim that steps back (a repeat, a config claimed elsewhere) on a trial
    another process has failed meanwhile: no "Cannot tell a FAIL trial"."""
    search(FakeRunner(), storage_url, trials=2, sampler="grid")
    study = load_study(storage_url)
    shared = SharedStudy(study)
    ledger = Ledger()
    ledger.refresh(study)
    measured = next(iter(ledger.finished))
    for config in (measured, VALID[-1]):
        trial = shared.ask(SPACE.distributions)
        if config != measured:
            ledger.claimed.add(config)  # another process is measuring it
        study.tell(trial.number, state=TrialState.FAIL)  # another process failed it meanwhile
        assert shared.claim(trial, config, ledger, budget=10) is False
        assert study.trials[trial.number].state is TrialState.FAIL


def test_a_measured_trial_failed_under_it_is_dropped_not_raised(storage_url):
    search(FakeRunner(), storage_url, trials=1, sampler="grid")
    study = load_study(storage_url)
    shared = SharedStudy(study)
    trial = shared.ask(SPACE.distributions)
    study.tell(trial.number, state=TrialState.FAIL)  # its heartbeat was found stale elsewhere
    assert shared.tell_measured(trial, 1.0, {"status": "ok", "time_ms": 1.0, "measurement": {}}) is False
    assert study.trials[trial.number].state is TrialState.FAIL
