"""Execution plans: for one input-shape signature, which values live in the arena and where.

A `Plan` is built after a *discovery* run of that signature, which executes
with fresh allocations and observes, per node, the output shapes and which
outputs share memory with which inputs (views). Those observations and the
types from runtime shape inference through the op schemas decide:

- which values are *buffers* (fresh memory) and which are views of another
  value (they extend its lifetime, `memory.AliasSets`);
- which buffers the arena backs: outputs of kernels that declared ``out=True``,
  whose inferred static shape matched the observed one, and whose alias set
  holds no graph output (a returned array must never be overwritten by a
  later run);
- in-place steps: a kernel that declared ``inplace`` writes into its dying
  input's arena buffer;
- the bound run loop: each step's callable with its ``out=`` buffer fixed.

With concurrent stages (`Stage`, chosen by an executor plugin), a stage is one moment of the plan: a
buffer defined in a stage lives from its first step, one read in a stage to
its last step, so branches running side by side never share bytes; and a
step in a stage writes in place only into a buffer its own branch made (no
other branch reads that).
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Mapping, Sequence

import attrs
import numpy as np

from .kernel import Kernel
from .memory import AliasSets, ArenaPlan, Block, align, plan_arena
from .tensor import TensorType
from .tuning import settled

# (callable, input slots, first output slot, all output slots, slots to drop after the step)
Step = tuple[Callable[..., Any], tuple[int, ...], int, tuple[int, ...], tuple[int, ...]]

Observed = tuple[tuple[int, ...], np.dtype]


class Steps(list):  # type: ignore[type-arg]
    """Steps not changed once made (a bound plan, a program's own): runloop.execute generates their function once."""

    run: Callable[[list[Any]], None] | None = None


# a Step whose callable may still await its arena buffer (see bind_buffers)
PendingStep = tuple[Any, tuple[int, ...], int, tuple[int, ...], tuple[int, ...]]


@attrs.frozen
class Stage:
    """Steps ``first`` to ``last`` (inclusive) of the run order, in independent ``branches``.

    No step of one branch reads a value a step of another branch writes, so
    the branches may run at the same time, each in its own order (an
    executor plugin decides which stages pay; the plan only keeps their
    buffers apart).
    """

    first: int
    last: int
    branches: tuple[tuple[int, ...], ...]


@attrs.define
class StepSpec:
    """What the engine knows about one step at build time."""

    kernel: Kernel
    fn: Callable[..., Any]
    ins: tuple[int, ...]
    outs: tuple[int, ...]


@attrs.define
class Plan:
    """A memory plan and bound run loop for one input-shape signature."""

    steps: list[PendingStep]
    buffers: dict[int, tuple[int, tuple[int, ...], np.dtype]]  # slot -> (offset, shape, dtype) in the arena
    arena_bytes: int
    report: Callable[[], dict[str, Any]]  # the numbers `Engine.memory_report` shows, worked out when it asks


@attrs.define
class PlanInput:
    """Everything `build_plan` reads: the steps, what inference and discovery found, the graph's edges."""

    specs: Sequence[StepSpec]
    types: Mapping[int, TensorType]  # slot -> inferred type, this signature
    observed: Mapping[int, Observed]  # slot -> (shape, dtype) seen in the discovery run
    aliases: Sequence[frozenset[tuple[int, int]]]  # per step: (output index, input index) pairs that shared memory
    intermediate: frozenset[int]  # slots produced by nodes
    graph_outputs: frozenset[int]
    free_after: Sequence[tuple[int, ...]]
    stages: Sequence[Stage] = ()  # runs of steps that may run concurrently


def _nbytes(shape: tuple[int, ...], dtype: np.dtype) -> int:
    return math.prod(shape) * dtype.itemsize  # ints: np.prod converts the tuple to an array first (~5x dearer)


def _last_use(specs: Sequence[StepSpec], outputs: frozenset[int]) -> dict[int, int]:
    last: dict[int, int] = {}
    for i, spec in enumerate(specs):
        for s in spec.ins:
            last[s] = i
        for s in spec.outs:
            last.setdefault(s, i)  # an unread output still occupies memory at its own step
    for s in outputs:
        last[s] = len(specs)  # graph outputs outlive the run
    return last


def _static(inp: PlanInput, slot: int) -> tuple[tuple[int, ...], np.dtype] | None:
    """The slot's shape when inference and observation agree on a static one, else None."""
    t, seen = inp.types.get(slot), inp.observed.get(slot)
    if t is None or seen is None or not t.is_static:
        return None
    shape = tuple(int(d) for d in t.shape)  # type: ignore[union-attr, arg-type]
    if shape != seen[0] or t.dtype != seen[1]:
        return None
    return shape, t.dtype


def build_plan(inp: PlanInput) -> Plan:
    """Decide buffers, aliasing and in-place steps; place the arena; bind each step's ``out=``."""
    specs = inp.specs
    last = _last_use(specs, inp.graph_outputs)
    sets = AliasSets()
    ends: dict[int, int] = {}
    roots: dict[int, tuple[int, tuple[int, ...], np.dtype]] = {}  # buffer slot -> (def step, shape, dtype)
    resident: dict[int, int] = {}  # slot -> buffer slot whose memory it is, for arena-eligible values
    outs_bound: dict[int, int] = {}  # step -> buffer slot it writes into
    inplace_steps: set[int] = set()
    reused = 0  # bytes of in-place results: memory a plan without reuse would allocate
    joined: dict[int, frozenset[tuple[int, int]]] = {}  # step -> (output, input) pairs whose memory the plan joined
    branch = {i: (n, k) for n, st in enumerate(inp.stages) for k, b in enumerate(st.branches) for i in b}

    def join(a: int, b: int) -> None:
        end = max(ends.get(sets.find(a), -1), ends.get(sets.find(b), -1))
        sets.union(a, b)
        ends[sets.find(a)] = end

    for i, spec in enumerate(specs):
        k = spec.kernel
        writes_out = k.out and len(spec.outs) == 1 and spec.outs[0] != 0
        for j, slot in enumerate(spec.outs):
            if not slot:
                continue
            ends[sets.find(slot)] = max(ends.get(sets.find(slot), -1), last.get(slot, i))
            shared = _shared_inputs(spec, j, inp.aliases[i], writes_out)
            static = _static(inp, slot)
            joined[i] = joined.get(i, frozenset()) | {(j, n) for n, s in enumerate(spec.ins) if s in shared}
            for src in shared:
                if src in inp.intermediate:
                    join(slot, src)
            if shared:
                continue
            if writes_out and static is not None:
                source = _inplace_source(spec, static, resident, roots, sets, ends, i, branch)
                if source is not None:
                    join(slot, source)
                    resident[slot] = resident[source]
                    outs_bound[i] = resident[source]
                    inplace_steps.add(i)
                    reused += _nbytes(*static)
                    continue
            if static is not None:
                roots[slot] = (i, static[0], static[1])
                if writes_out:
                    resident[slot] = slot
                    outs_bound[i] = slot
    return _finish(inp, last, sets, ends, roots, resident, outs_bound, inplace_steps, reused, joined)


def _shared_inputs(spec: StepSpec, j: int, seen: frozenset[tuple[int, int]], writes_out: bool) -> list[int]:
    """Input slots output ``j`` may share memory with: declared by the kernel, else as observed."""
    k = spec.kernel
    if writes_out or k.views is False:
        return []
    if k.views:
        return [s for s in spec.ins if s]
    return [spec.ins[n] for o, n in seen if o == j]


def _inplace_source(
    spec: StepSpec,
    static: tuple[tuple[int, ...], np.dtype],
    resident: Mapping[int, int],
    roots: Mapping[int, tuple[int, tuple[int, ...], np.dtype]],
    sets: AliasSets,
    ends: Mapping[int, int],
    step: int,
    branch: Mapping[int, tuple[int, int]],
) -> int | None:
    """An input of this step whose arena buffer may take the output: same shape, dying here.

    In a stage, only a buffer made in this step's branch: another branch may
    still be reading one made before the stage.
    """
    for n in spec.kernel.inplace:
        if n >= len(spec.ins):
            continue
        src = spec.ins[n]
        if src not in resident or spec.ins.count(src) > 1:
            continue
        made, shape, dtype = roots[resident[src]]
        if step in branch and branch.get(made) != branch[step]:
            continue
        if (shape, dtype) == static and ends.get(sets.find(src), -1) == step:
            return src
    return None


def _finish(
    inp: PlanInput,
    last: Mapping[int, int],
    sets: AliasSets,
    ends: Mapping[int, int],
    roots: Mapping[int, tuple[int, tuple[int, ...], np.dtype]],
    resident: Mapping[int, int],
    outs_bound: dict[int, int],
    inplace_steps: set[int],
    reused: int,
    joined: Mapping[int, frozenset[tuple[int, int]]],
) -> Plan:
    tainted = {sets.find(s) for s in inp.graph_outputs}  # sets a caller will hold on to
    span = {i: (st.first, st.last) for st in inp.stages for i in range(st.first, st.last + 1)}
    blocks, arena_blocks = [], []
    for slot, (d, shape, dtype) in roots.items():
        root = sets.find(slot)
        end = max(ends.get(root, d), last.get(slot, d))
        # a stage is one moment: what it defines lives from its start, what it reads to its end
        block = Block(slot, _nbytes(shape, dtype), span.get(d, (d, d))[0], span.get(end, (end, end))[1])
        if block.size == 0:
            continue
        blocks.append(block)
        if root not in tainted and resident.get(slot) == slot:
            arena_blocks.append(block)
    physical = {b.key for b in arena_blocks}
    for i in list(outs_bound):
        if outs_bound[i] not in physical or sets.find(outs_bound[i]) in tainted:
            del outs_bound[i]
    n = len(inp.specs)
    real = plan_arena(arena_blocks, n + 1, sum(b.size for b in arena_blocks))
    buffers = {s: (real.offsets[s], roots[s][1], roots[s][2]) for s in physical}
    # every buffer's plan (outputs too) is only reported: placed when asked, not in a new shape's first run
    report = functools.partial(_report, blocks, reused, n + 1, real, len(arena_blocks), len(inplace_steps & set(outs_bound)))
    steps_ = [_bound_step(spec, outs_bound.get(i), inp.free_after[i], joined.get(i, frozenset()))
              for i, spec in enumerate(inp.specs)]
    return Plan(steps_, buffers, real.arena_bytes, report)


def _bound_step(spec: StepSpec, buffer_slot: int | None, free: tuple[int, ...],
                joined: frozenset[tuple[int, int]]) -> PendingStep:
    # the buffer itself is bound later (bind_buffers), once the arena exists; the plan follows a discovery run,
    # which made each Choice's pick for these shapes
    fn = settled(spec.fn)
    if buffer_slot is not None:
        return (_OutMarker(fn, buffer_slot), spec.ins, spec.outs[0], spec.outs, free)
    every = len(spec.outs) * len(spec.ins)
    if spec.kernel.views is not False and len(joined) < every:
        # A step run without ``out=`` that may return views, where the plan did not join every output to
        # every input (it trusted the discovery run, or an ``out=`` it did not bind in the end). Whether a
        # kernel aliases can depend on input *values* (Resize by a runtime scale of 1, Pad by zero pads,
        # return their input): every run checks, and copies an output aliasing an input it was not joined to.
        fn = _FreshOutputs(fn, joined)
    return (fn, spec.ins, spec.outs[0] if spec.outs else 0, spec.outs, free)


class _FreshOutputs:
    """A step's callable whose outputs share memory with its inputs only where ``allowed`` (output, input) says."""

    __slots__ = ("fn", "allowed")

    def __init__(self, fn: Callable[..., Any], allowed: frozenset[tuple[int, int]]) -> None:
        self.fn = fn
        self.allowed = allowed

    def __call__(self, *args: Any) -> Any:
        res = self.fn(*args)
        several = type(res) is tuple or type(res) is list
        results = res if several else (res,)
        copy = {j for j, n in shared_memory(results, args) if (j, n) not in self.allowed}
        if not copy:
            return res
        fresh = [np.array(r, copy=True) if j in copy else r for j, r in enumerate(results)]
        return tuple(fresh) if several else fresh[0]


def shared_memory(results: Sequence[Any], args: Sequence[Any]) -> frozenset[tuple[int, int]]:
    """(output index, input index) pairs whose memory overlaps: the output is a view of that input."""
    return frozenset((j, n) for j, r in enumerate(results) if isinstance(r, np.ndarray)
                     for n, a in enumerate(args) if isinstance(a, np.ndarray) and np.may_share_memory(r, a))


@attrs.frozen
class _OutMarker:
    """A step awaiting its arena buffer: `bind_buffers` replaces it with ``partial(fn, out=buffer)``."""

    fn: Callable[..., Any]
    slot: int


def bind_buffers(plan: Plan, arena: np.ndarray) -> Steps:
    """The plan's run loop with each ``out=`` bound to its view into ``arena``."""
    views = {
        s: arena[off : off + _nbytes(shape, dtype)].view(dtype).reshape(shape)
        for s, (off, shape, dtype) in plan.buffers.items()
    }
    bound = Steps((functools.partial(fn.fn, out=views[fn.slot]) if isinstance(fn, _OutMarker) else fn, *rest)
                  for fn, *rest in plan.steps)
    bound.run = generate(bound)  # here, in the discovery run that planned it, not in the next run (~25 us a step)
    return bound


def generate(steps: Sequence[Step]) -> Callable[[list[Any]], None]:
    """The function running ``steps`` (runloop.execute): a line a step, ``r = f3(v[1], v[2]); v[5] = r; v[1] = None``;
    its code depends on the slots alone, so it is compiled once for all the plans (and arenas) of one structure."""
    env: dict[str, Any] = {"_put": _put}
    lines = ["def run(v):"]
    for i, (fn, ins, out0, outs, free) in enumerate(steps):
        env[f"f{i}"] = fn  # a tuple or list result is several outputs (or one in a tuple), stored by `_put`
        lines.append(f" r = f{i}({''.join(f'v[{s}], ' for s in ins)}); v[{out0}] = r if type(r) is not tuple and "
                     f"type(r) is not list else _put(v, {outs}, r)" + "".join(f"; v[{s}] = None" for s in free))
    exec(_compiled("\n".join(lines + [" return"])), env)
    return env.pop("run")  # type: ignore[no-any-return]  # (kept in env, it would be a cycle: freed only by the gc)


@functools.lru_cache(maxsize=64)
def _compiled(source: str) -> Any:  # a code object
    return compile(source, "<minfer run loop>", "exec")


def _put(vals: list[Any], outs: tuple[int, ...], res: Sequence[Any]) -> Any:
    for slot, value in zip(outs, res):
        vals[slot] = value
    vals[0] = None  # omitted outputs land in slot 0, which must stay None
    return vals[outs[0]] if outs else None


def _report(blocks: list[Block], reused: int, steps: int, real: ArenaPlan, arena_backed: int, inplace: int) -> dict[str, Any]:
    full = plan_arena(blocks, steps, sum(b.size for b in blocks) + reused)
    return {
        "arena_bytes": full.arena_bytes,
        "naive_bytes": full.naive_bytes,
        "live_set_bytes": full.live_set_bytes,
        "arena_over_live_set": round(full.arena_bytes / full.live_set_bytes, 4) if full.live_set_bytes else 1.0,
        "buffers": len(blocks),
        "allocated_arena_bytes": align(real.arena_bytes),
        "arena_backed_buffers": arena_backed,
        "inplace_steps": inplace,
    }
