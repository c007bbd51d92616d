"""When to poll for a batch's answer instead of sleeping (pure, no I/O).

On a VM, waking a sleeping process costs about 50 µs per hop, more than a
small batch takes. Polling (the parent for the doorbell, the worker for the
next request) avoids both wakeups, but only pays while batches come one at a
time: with several in flight, or when a poll runs out because the CPUs are
busy, the CPUs are better left to the workers.
"""

from __future__ import annotations

LONE_BEFORE_SPIN = 8  # lone batches in a row before polling replaces sleeping
# The worker polls for the next request this many times as long as the parent polls
# for an answer: between two events the parent does its own work (on a replay
# ~0.4 ms: state, audit, broker), longer than one poll, and a worker that went to
# sleep meanwhile costs a wakeup on every event.
WORKER_LINGER = 4
FIRST_PAUSE = 8  # batches without polling after a poll ran out...
PAUSE_AFTER_MISS = 64  # ...doubling, up to this, while polls keep running out


class SpinPolicy:
    """Tracks batches in flight; says per batch how long to poll (0 = sleep)."""

    def __init__(self, spin_us: int) -> None:
        self.spin_us = spin_us
        self.inflight = 0
        self._crowded = 0  # times a batch started while another was in flight
        self._lone_streak = 0  # batches in a row that ran with no other in flight
        self._pause = 0  # batches left without polling after a miss
        self._next_pause = FIRST_PAUSE
        self._polling = False  # the lone batch in flight was told to poll

    def start(self) -> tuple[int, int]:
        """A batch begins: (microseconds to poll, token for :meth:`finish`)."""
        lone = self.inflight == 0 and self._lone_streak >= LONE_BEFORE_SPIN
        if self._pause > 0:
            self._pause -= 1
            lone = False
        self.inflight += 1
        if self.inflight > 1:
            self._crowded += 1
        self._polling = lone
        return (self.spin_us if lone else 0), self._crowded

    def alone(self) -> bool:
        """True while exactly one batch is in flight (polling may go on)."""
        return self.inflight == 1

    def finish(self, token: int, missed: bool) -> None:
        """A batch ended; ``missed`` when its poll ran out before the answer.

        A miss pauses polling for a while, doubling while polls keep missing (an
        agent whose hooks are slower than a poll) and back to short after a poll
        that caught its answer: an occasional late answer (a collection, a
        preempted worker) costs a few sleeping batches, not a long run of them."""
        self.inflight -= 1
        self._lone_streak = self._lone_streak + 1 if token == self._crowded else 0
        if missed:
            self._pause = self._next_pause
            self._next_pause = min(PAUSE_AFTER_MISS, self._next_pause * 2)
        elif self._polling:
            self._next_pause = FIRST_PAUSE
        self._polling = False
