"""The whole model from its tensor-parallel ranks' shares: the arrays gathered, the import record widened.

Each of ``tp`` ranks holds of a ``@shard(column)`` parameter its share of every checkpoint tensor
the parameter packs (q, k and v of a fused QKV weight: ``[q_r; k_r; v_r]``, a share of each), and
of a ``@shard(row)`` one its share of the input columns. :func:`whole_arrays` all-gathers a
rank's arrays over the ``tp`` group and puts each parameter together as the whole model lays it
out (the ranks' shares of each packed tensor one after another, then the next tensor), so that
every rank has the whole model's values: to save a checkpoint (``save_hf``), or to compare a
gradient with one process's. :func:`whole_record` is the import record of the whole tensors,
whose parts' sizes a save splits the packed parameters by.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from modeldsl.dialects.annotations import SHARD_DIMS
from modeldsl.dialects.graph import ModelOp
from modeldsl.hf.checkpoint import ImportRecord, RankSlices
from modeldsl.passes.shard import param_shardings
from modeldsl.rank_config import stacked_names
from modeldsl.runtime import distributed


def gathered(value: np.ndarray, tp: int) -> np.ndarray:
    """Every tensor-parallel rank's ``value``, stacked along a new first dim in rank order."""
    out = np.empty((tp, *value.shape), value.dtype)
    distributed.communicator().run("all_gather", "tp", np.ascontiguousarray(value), out)
    return out


def part_rows(record: ImportRecord, name: str, layer: int | None, rows: int) -> list[int]:
    """The rows each packed checkpoint tensor takes in one rank's share of a column-parallel parameter
    (one part of ``rows`` where the load read none)."""
    reads = record.reads.get((name, layer))
    sizes = [read.shape[0] for read in reads] if reads else [rows]
    return sizes if sum(sizes) == rows else [rows]


def whole_column(shares: np.ndarray, sizes: list[int]) -> np.ndarray:
    """One layer of a column-parallel parameter from the ranks' shares ``[tp, rows, ...]``: for each
    packed tensor, its rows of every rank in rank order."""
    pieces, start = [], 0
    for size in sizes:
        pieces += [share[start:start + size] for share in shares]
        start += size
    return np.concatenate(pieces, axis=0)


def whole_arrays(model: ModelOp, record: ImportRecord, arrays: dict[str, np.ndarray],
                 tp: int) -> dict[str, np.ndarray]:
    """``arrays`` (by parameter name, one rank's) with each sharded parameter's whole value; the
    same on every rank (a collective: every rank of the ``tp`` group calls it with the same names)."""
    if tp == 1:
        return dict(arrays)
    strategies, stacked = param_shardings(model), stacked_names(model)
    whole = dict(arrays)
    for name in sorted(arrays):
        dim = SHARD_DIMS.get(strategies.get(name, ""))
        if dim is None:
            continue
        shares = gathered(np.asarray(arrays[name]), tp)
        layers = range(shares.shape[1]) if name in stacked else [None]
        built = []
        for layer in layers:
            layer_shares = shares if layer is None else shares[:, layer]
            if dim == 1:
                built.append(np.concatenate(list(layer_shares), axis=1))
            else:
                built.append(whole_column(layer_shares, part_rows(record, name, layer, layer_shares.shape[1])))
        whole[name] = np.stack(built) if name in stacked else built[0]
    return whole


def whole_moments(model: ModelOp, record: ImportRecord, moments: dict[str, np.ndarray],
                  tp: int) -> dict[str, np.ndarray]:
    """The optimizer moments (``exp_avg.PARAM``, ``exp_avg_sq.PARAM``) of the whole model, gathered as
    :func:`whole_arrays` gathers the parameters."""
    whole: dict[str, np.ndarray] = {}
    for prefix in sorted({key.split(".", 1)[0] + "." for key in moments}):
        mine = {key[len(prefix):]: value for key, value in moments.items() if key.startswith(prefix)}
        whole |= {prefix + name: value for name, value in whole_arrays(model, record, mine, tp).items()}
    return whole


def whole_record(record: ImportRecord, slices: RankSlices) -> ImportRecord:
    """The import record of the whole tensors a rank read slices of (their shapes the whole ones; no
    memory-mapped arrays, so a save writes the values it is given)."""
    reads = {key: [replace(read, shape=widened(read.shape, slices.get(read.name))) for read in found]
             for key, found in record.reads.items()}
    return ImportRecord(record.source, reads, {}, record.prefix)


def widened(shape: tuple[int, ...], cut: tuple[int, int, int] | None) -> tuple[int, ...]:
    if cut is None:
        return shape
    dim, _, parts = cut
    return (*shape[:dim], shape[dim] * parts, *shape[dim + 1:])
