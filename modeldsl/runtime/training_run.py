"""A training run from Python: ``modeldsl.train(model, data, steps=..., ...)``, which ``mdsl-run --train`` drives.

:func:`train` loads a checkpoint folder (with ``lora=`` adapters when asked) or takes a loaded
:class:`~modeldsl.runtime.model.Model`, reads the data (:class:`TrainingData`: plain text and
``{"text": ...}`` JSONL packed into sequences, or prompt/completion and chat JSONL one example per
sequence with the loss on the completions) and returns a :class:`TrainingRun`:
:meth:`TrainingRun.step` runs one optimizer step (``grad_accum`` micro-batches of ``batch``
sequences of ``seq`` tokens, AdamW with warmup and cosine decay) and returns its
:class:`StepInfo`, which every callback is called with; :meth:`TrainingRun.run` steps to the end;
:meth:`TrainingRun.evaluate` is the mean loss over every target token of the evaluation data;
:meth:`TrainingRun.save` writes the trained checkpoint (or, with adapters, the PEFT adapter) and the
training state that ``mdsl-run --resume`` continues bit for bit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from modeldsl.diagnostics import Diagnostic, DiagnosticError
from modeldsl.runtime.optim import AdamWConfig

STATE_FILE = "training_state.npz"
PACKINGS = ("padded", "packed")
MASTERS = "master."  # training state arrays: the fp32 weights of a save written in a narrower dtype


@dataclass(frozen=True)
class StepInfo:
    """What one optimizer step did: what the callbacks get."""

    step: int  # 1-based: the steps done
    loss: float  # the mean loss over the step's target tokens (per micro-batch, averaged)
    lr: float
    tokens_per_second: float
    grad_norm: float  # before clipping
    epoch: int
    seconds: float
    eval_loss: float | None = None  # where the step evaluated


def eos_id(folder: Path, tokenizer) -> int | None:
    """The EOS token id of a checkpoint's tokenizer: config.json or generation_config.json's
    ``eos_token_id`` (the first of a list), else tokenizer_config.json's ``eos_token``."""
    if tokenizer.inner is None:
        return None
    for name in ("config.json", "generation_config.json"):
        try:
            value = json.loads((folder / name).read_text()).get("eos_token_id")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, list) and value:
            value = value[0]
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    try:
        token = json.loads((folder / "tokenizer_config.json").read_text()).get("eos_token")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(token, dict):
        token = token.get("content")
    return tokenizer.inner.token_to_id(token) if isinstance(token, str) else None


@dataclass
class TrainingData:
    """Training (or evaluation) data read for one checkpoint's tokenizer: a token stream cut into
    sequences, or instruction examples one per sequence."""

    name: str  # how messages name it: the file, or "the documents given"
    file: str | None  # the file read (None: documents given)
    tokens: np.ndarray
    fingerprint: str
    documents: int = 0
    instructions: Any = None  # modeldsl.runtime.instructions.InstructionData for instruction data
    how: str = "with tokenizer.json"

    @classmethod
    def read(cls, data: str | Path | Sequence[str], folder: Path, tokenizer, eos: int | None, seq: int,
             warn: Callable[[Diagnostic], None] | None = None) -> TrainingData:
        """``data``: a text or ``.jsonl`` file, or documents (strings). W014 to ``warn`` for
        examples cut at or left out of ``seq + 1`` tokens."""
        from modeldsl.runtime.data import fingerprint, read_documents, token_stream
        from modeldsl.runtime.instructions import InstructionData, examples_fingerprint, is_instruction_data

        how = "with tokenizer.json" if tokenizer.inner is not None else \
            "as UTF-8 bytes: the checkpoint has no tokenizer.json"
        if isinstance(data, (str, Path)):
            name = f"the training data '{data}'"
            if is_instruction_data(data):
                examples = InstructionData.read(data, folder, tokenizer, eos, seq)
                for note in examples.notes():
                    (warn or _warning)(Diagnostic("W014", f"{name}: {note}", None,
                                                  "give a longer --seq to train on whole examples"))
                return cls(name, str(data), examples.tokens, examples_fingerprint(examples.examples), 0, examples,
                           how)
            documents = read_documents(data)
        elif isinstance(data, Sequence) and all(isinstance(d, str) for d in data):
            name, documents = "the documents given", list(data)
        else:
            raise DiagnosticError([Diagnostic("E029", f"data={type(data).__name__} is not a file or a list of "
                                              "documents", None, "give a text or .jsonl file, or a list of strings")])
        tokens = token_stream(documents, tokenizer.encode, eos, name)
        return cls(name, str(data) if isinstance(data, (str, Path)) else None, tokens, fingerprint(tokens),
                   len(documents), None, how)

    def check_vocabulary(self, vocab: int | None) -> None:
        from modeldsl.runtime.data import check_vocabulary

        check_vocabulary(self.tokens, vocab, self.name, self.how)

    def batches(self, seq: int, state: dict | None = None, packing: str = "padded"):
        """The data's batches from ``state`` (position and epoch) or the start; instruction
        examples one per row (``padded``) or as many whole ones as fit (``packed``)."""
        from modeldsl.runtime.data import PackedBatches

        state = state or {}
        if self.instructions is not None:
            return self.instructions.batches(state, packing)
        return PackedBatches(self.tokens, seq, int(state.get("position", 0)), int(state.get("epoch", 0)))

    def describe(self, packing: str = "padded") -> str:
        """``6 prompt/completion examples, ...`` or ``3 documents``, and how it is tokenized."""
        data = self.instructions
        rows = "one per sequence" if packing == "padded" else "packed, attending within each example"
        what = (f"{len(data.examples)} {data.kind} examples, the loss on their "
                f"{'assistant' if data.kind == 'chat' else 'completion'} tokens, {rows}"
                if data is not None else f"{self.documents} document{'s' if self.documents != 1 else ''}")
        return f"{what}, {self.how.split(':')[0]}"

    def where(self, batches) -> str:
        """How far ``batches`` have read: ``example 3 of 6`` or ``token 120 of 4096``."""
        if self.instructions is not None:
            return f"example {batches.position} of {len(self.instructions.examples)}"
        return f"token {batches.position} of {len(self.tokens)}"

    def evaluation_batches(self, batch: int, seq: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """The data once over, in micro-batches of ``batch`` rows (the last filled with ignored rows)."""
        batches = self.batches(seq)
        rows: list[tuple[np.ndarray, np.ndarray]] = []
        while batches.epoch == 0 and (not rows or batches.position != 0):
            made = batches.next_batch(1)
            inputs, labels = (made.inputs, made.labels) if hasattr(made, "labels") else made
            rows.append((inputs[0], labels[0]))
        while len(rows) % batch:
            rows.append((rows[0][0], np.full_like(rows[0][1], -100)))
        return [(np.stack([r[0] for r in rows[i:i + batch]]), np.stack([r[1] for r in rows[i:i + batch]]))
                for i in range(0, len(rows), batch)]


def _warning(diagnostic: Diagnostic) -> None:
    from modeldsl.hf.compat import warn_python

    warn_python(diagnostic)


@dataclass(frozen=True)
class Gathered:
    """What a save of a run writes: the moments (None: the trainer's own) and the (model, weights,
    import record) of the checkpoint."""

    moments: dict[str, np.ndarray] | None
    checkpoint: tuple[Any, dict[str, np.ndarray], Any]


def check_resumable(tp: int, folder: str = "FOLDER") -> None:
    """E029 for resuming a run of ``tp`` tensor-parallel ranks (each would re-cut its share of the
    saved moments: not built yet)."""
    if tp > 1:
        raise DiagnosticError([Diagnostic("E029", "resuming a tensor-parallel run is not implemented yet", None,
                                          f"the saved folder is an ordinary checkpoint: train on from it with --hf "
                                          f"{folder} (a new optimizer state)")])


MAX_GRAD_ACCUM = 1 << 16  # micro-batches of one step (each cut from the data before the step runs)

@dataclass
class TrainingRun:
    """A model being trained: its trainer, data, schedule and what the steps gave."""

    model: Any  # modeldsl.runtime.model.Model
    data: TrainingData
    steps: int
    batch: int
    seq: int
    config: AdamWConfig
    grad_accum: int = 1
    dtype: str = "fp32"
    recompute: str = "annotated"
    seed: int = 0
    callbacks: list[Callable[[StepInfo], Any]] = field(default_factory=list)
    eval_data: TrainingData | None = None
    eval_every: int = 0
    state: Any = None  # a modeldsl.runtime.train.TrainingState to continue from
    warn: Callable[[Diagnostic], None] | None = None
    packing: str = "padded"  # instruction examples one per row, or packed (several per row, attending apart)
    dp: int = 1  # data-parallel ranks (processes of an MPI launch): each trains on its rows of every batch
    zero: bool = False  # ZeRO-1: the optimizer state shared out over the dp ranks
    tp: int = 1  # tensor-parallel ranks: the model is one rank's share (modeldsl.load(tp=...))

    def __post_init__(self) -> None:
        if self.packing not in PACKINGS:
            raise _error(f"packing={self.packing!r} is not padded or packed", "give packing='padded' or 'packed'")
        if self.packing == "packed" and self.data.instructions is None:
            raise _error("packing applies to instruction data (prompt/completion or chat examples); plain text is "
                         "one stream already", "leave packing out for text")
        if self.grad_accum > MAX_GRAD_ACCUM:
            raise _error(f"grad_accum {self.grad_accum}: a step cuts all its micro-batches before it runs, and "
                         f"takes at most {MAX_GRAD_ACCUM}", "give fewer micro-batches, or a larger batch")
        limit = self.model.max_positions
        if limit is not None and self.seq > limit:
            raise _error(f"seq {self.seq} is more than the model's {limit} positions (max_position_embeddings)",
                         f"give seq={limit} or less")
        self.data.check_vocabulary(self.model.config("vocab_size"))
        self.communicator = self.start_ranks()
        if self.eval_data is not None:
            self.eval_data.check_vocabulary(self.model.config("vocab_size"))
        self.rng = np.random.default_rng(self.seed)  # training draws nothing yet; saved and restored for what will
        self.losses: list[float] = []
        self.history: list[StepInfo] = []
        state = self.state
        if state is not None:
            check_resumable(self.tp)
        self.batches = self.data.batches(self.seq, state.meta.get("data", {}) if state is not None else None,
                                         self.packing)
        if state is not None:
            self.losses = [float(x) for x in state.arrays.get("losses", np.zeros(0))]
            self.rng.bit_generator.state = state.meta["rng"]
            restore_masters(self.model, state)
        self.trainer = self.make_trainer()
        if state is not None:
            self.trainer.restore(state.step, state.moments, state.rng_step)

    def start_ranks(self):
        """The process's communicator for ``tp`` tensor- and ``dp`` data-parallel ranks (E048 where the batch
        does not divide, or the model is not one of ``tp`` ranks')."""
        from modeldsl.runtime import distributed

        for name in ("dp", "tp"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise _error(f"{name}={value!r} is not a positive integer",
                             f"give {name}=1, or the ranks of the launch")
        if self.model.tp != self.tp:
            raise distributed.layout_error(f"tp={self.tp}, but the model is loaded for tp={self.model.tp}",
                                           f"load it with modeldsl.load(..., tp={self.tp}), or give the folder")
        if self.batch % self.dp:
            raise distributed.layout_error(f"batch {self.batch} does not divide into dp={self.dp} ranks' rows",
                                           f"give a batch that is a multiple of {self.dp}")
        if self.dp > 1 and self.model.device is not None:
            raise distributed.layout_error("data parallelism runs on the CPU for now (MPI ranks)",
                                           "leave out the device, or train on one process")
        return distributed.start(distributed.Layout(tp=self.tp, dp=self.dp))

    @property
    def rank(self) -> int:
        """This process's rank (0 for one process): the one that prints and saves."""
        return self.communicator.rank

    def make_trainer(self):
        from modeldsl.runtime.train import Trainer

        packed = self.packing == "packed"
        if self.model.device is None:
            return Trainer(self.model, self.config, dtype=self.dtype, recompute=self.recompute, warn=self.warn,
                           packed=packed, dp=self.dp, zero=self.zero)
        from modeldsl.runtime.cuda_train import CudaTrainer

        return CudaTrainer(self.model, self.config, dtype=self.dtype, device=self.model.device,
                           recompute=self.recompute, warn=self.warn, packed=packed)

    @property
    def done(self) -> int:
        return self.trainer.step

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.grad_accum * self.seq

    def compile(self):
        """The training step's executor, compiled and checked against the memory (E038) before a batch is cut."""
        return self.trainer.executor(self.batch // self.dp, self.seq)

    def step(self) -> StepInfo:
        """One optimizer step; every callback gets its :class:`StepInfo`."""
        micro = [self.rows(b) for b in self.batches.micro_batches(self.batch, self.grad_accum)]
        lr = self.config.lr_at(self.trainer.step)
        tick = time.perf_counter()
        loss = self.trainer.train_step(micro)
        seconds = time.perf_counter() - tick
        self.losses.append(loss)
        evaluated = self.evaluate() if self.eval_every and self.trainer.step % self.eval_every == 0 else None
        info = StepInfo(self.trainer.step, loss, lr, self.tokens_per_step / seconds if seconds > 0 else float("inf"),
                        self.trainer.grad_norm, self.batches.epoch, seconds, evaluated)
        self.history.append(info)
        for callback in self.callbacks:
            callback(info)
        return info

    def rows(self, batch) -> tuple[np.ndarray, ...]:
        """A micro-batch as the trainer takes it: (tokens, labels), packed with segments and positions;
        with ``dp`` ranks this rank's consecutive rows of it."""
        if not hasattr(batch, "labels"):
            arrays = tuple(batch)
        elif self.packing == "packed":
            arrays = batch.inputs, batch.labels, batch.segments, batch.positions
        else:
            arrays = batch.inputs, batch.labels
        if self.dp == 1:
            return arrays
        from modeldsl.runtime import distributed

        per, at = self.batch // self.dp, distributed.rank_in("dp")
        return tuple(a[at * per:(at + 1) * per] for a in arrays)

    def run(self, until: int | None = None) -> list[StepInfo]:
        """Step to step ``until`` (default: the end); what those steps gave."""
        last = self.steps if until is None else min(until, self.steps)
        return [self.step() for _ in range(self.trainer.step, last)]

    def evaluate(self, data: TrainingData | None = None) -> float:
        """The mean loss over every target token of ``data`` (default: the evaluation data), the
        model as trained so far (no gradient, no dropout)."""
        data = data or self.eval_data
        if data is None:
            raise _error("there is no evaluation data", "give eval_data= (or --eval DATA)")
        return evaluation_loss(self.trainer, data, self.batch, self.seq)[0]

    # ------------------------------------------------------------------ saving
    def meta(self, base: str | None = None) -> dict[str, Any]:
        """What the training state records besides the arrays: the run's settings, the data's
        position and fingerprint, the random state."""
        return {"run": {"steps": self.steps, "batch": self.batch, "seq": self.seq, "grad_accum": self.grad_accum,
                        "seed": self.seed, "dtype": self.dtype, "packing": self.packing, "dp": self.dp,
                        "zero": self.zero, "tp": self.tp,
                        **({"base": base} if base is not None else {})},
                "data": {"file": self.data.file, "tokens": int(len(self.data.tokens)), "sha256": self.data.fingerprint,
                         **self.batches.state()},
                "rng": self.rng.bit_generator.state}

    def has_adapters(self) -> bool:
        return any(p.is_adapter for p in self.model.model.params())

    def write(self, folder: Path, meta: dict[str, Any], gathered: Gathered, save_dtype: str | None = None) -> None:
        """The checkpoint (with adapters: the PEFT adapter and the tokenizer) and the training state into
        ``folder``, from what :meth:`gathered` gave (the whole model's on tensor-parallel ranks)."""
        from modeldsl.hf.checkpoint import copy_tokenizer, save_checkpoint
        from modeldsl.runtime.lora import write_adapter
        from modeldsl.runtime.model import STORAGE
        from modeldsl.runtime.train import save_training_state

        model = self.model
        written_model, weights, record = gathered.checkpoint
        if self.has_adapters():
            write_adapter(folder, model.model, model.weights, meta["run"].get("base"))
            copy_tokenizer(model.record, folder)
            written = {"float32"}
        else:
            written = save_checkpoint(written_model, weights, record, folder,
                                      STORAGE[save_dtype] if save_dtype else None)
        arrays = {"losses": np.asarray(self.losses, np.float64)}
        if written - {"float32"}:  # rounded tensors: keep the masters for --resume
            arrays |= {MASTERS + n: np.asarray(weights[n], np.float32) for n in self.trainer.optimizer.grads}
        save_training_state(folder / STATE_FILE, self.trainer, meta, arrays, gathered.moments)

    def gathered(self) -> Gathered:
        """What a save writes, the trained weights synced into the model (every rank calls it, before rank
        0 writes): under ZeRO-1 every rank's share of the moments; on tensor-parallel ranks the whole
        checkpoint and moments, the shares put together; else the model's own (the moments the
        trainer's)."""
        self.trainer.sync_weights()
        moments = self.trainer.state_arrays() if self.zero else None
        if self.tp > 1:
            from modeldsl.runtime.tensor_parallel import whole_moments

            moments = whole_moments(self.model.model, self.model.record, moments or self.trainer.state_arrays(),
                                    self.tp)
        return Gathered(moments, self.model.whole_checkpoint(self.model.weights))

    def save(self, out: str | Path, overwrite: bool = False, save_dtype: str | None = None) -> None:
        """Write the run into the folder ``out`` (replaced atomically: a new or empty folder, or a
        save of this run; anything else E044 unless ``overwrite``), for ``mdsl-run --resume``. Of
        several ranks rank 0 writes (:meth:`gathered` gives it what the others hold)."""
        from modeldsl.runtime.saves import SaveTarget, new_run, saving_folder

        gathered = self.gathered()
        if self.rank != 0:
            return
        if not hasattr(self, "run_id"):
            self.run_id = new_run()
        target = SaveTarget(Path(out), self.run_id, overwrite=overwrite, what=f"save('{out}')",
                            how="overwrite=True", owner="this run")
        base = self.model.record.source
        try:
            with saving_folder(target) as folder:
                self.write(folder, self.meta(str(Path(base).resolve()) if base and self.has_adapters() else None),
                           gathered, save_dtype)
        except OSError as err:
            raise DiagnosticError([Diagnostic("E028", f"cannot write the run to '{out}': {err.strerror or err}",
                                              None, "give a folder you can write")]) from None


def evaluation_loss(trainer, data: TrainingData, batch: int, seq: int) -> tuple[float, int]:
    """(the mean loss over every target token of ``data``, how many there are), the trainer's
    model as it stands, in micro-batches of ``batch`` sequences of ``seq`` tokens."""
    total, count = 0.0, 0
    for tokens, labels in data.evaluation_batches(batch, seq):
        targets = int(np.count_nonzero(labels != -100))
        if targets:
            total += trainer.evaluate(tokens, labels) * targets
            count += targets
    return (total / count if count else float("nan")), count


def restore_masters(model, state) -> None:
    """Put the fp32 master weights a narrower save kept in its training state into the model
    (the checkpoint's tensors are them rounded), so a resumed run continues bit for bit."""
    for key, value in state.arrays.items():
        if not key.startswith(MASTERS):
            continue
        name = key.removeprefix(MASTERS)
        weight = model.weights.get(name)
        if weight is None or weight.shape != value.shape or not np.issubdtype(value.dtype, np.floating):
            raise ValueError(f"its master weights '{name}' {value.dtype}{list(value.shape)} fit no "
                             "parameter of the model (saved from another model?)")
        if weight.flags.writeable:
            np.copyto(weight, value, casting="unsafe")
        else:  # still the loaded, read-only array
            model.weights[name] = np.array(value, dtype=weight.dtype)


def _error(message: str, hint: str) -> DiagnosticError:
    return DiagnosticError([Diagnostic("E029", message, None, hint)])


def train(model, data, *, steps: int, batch: int, seq: int, lr: float, lora: Any = None, grad_accum: int = 1,
          warmup: int = 0, weight_decay: float = 0.01, clip: float = 1.0, min_lr_ratio: float = 0.0,
          dtype: str = "fp32", recompute: str = "annotated", seed: int = 0,
          callbacks: Sequence[Callable[[StepInfo], Any]] = (), eval_data: Any = None, eval_every: int = 0,
          model_file: str | Path | None = None, base_dtype: str | None = None,
          packing: str = "padded", dp: int = 1, zero: bool = False, tp: int = 1) -> TrainingRun:
    """A :class:`TrainingRun` of ``model`` (a checkpoint folder, loaded with ``model_file`` or the
    std model of its architecture and with ``lora`` adapters where given, their frozen base stored in
    ``base_dtype`` (``bf16``, ``fp8``) where given; or a loaded model) on
    ``data`` (a text or ``.jsonl`` file, or a list of documents). Call ``run()`` (or ``step()``),
    then ``save(OUT)``. ``dp``: data-parallel ranks, the processes of an MPI launch
    (``mpiexec -n DP python script.py``): each trains on its rows of every batch; ``zero``: ZeRO-1,
    the optimizer state shared out over them. ``tp``: tensor-parallel ranks (``tp * dp`` processes,
    tensor-parallel ranks innermost), each holding its share of the heads and of the MLP (the model
    is then loaded here, for this rank)."""
    from modeldsl.runtime.model import load
    from modeldsl.tokenizer import Tokenizer

    for name, value, low in (("steps", steps, 1), ("batch", batch, 1), ("seq", seq, 1), ("grad_accum", grad_accum, 1),
                             ("warmup", warmup, 0), ("seed", seed, 0), ("eval_every", eval_every, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise _error(f"{name}={value!r} is not an integer >= {low}", f"give {name}={max(low, 1)} or more")
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise _error(f"lr={lr!r} is not a positive number", "give a learning rate: lr=1e-3")
    if isinstance(model, (str, Path)):
        folder = Path(model)
        if tp != 1:
            from modeldsl.runtime import distributed

            distributed.start(distributed.Layout(tp=tp, dp=dp))
        model = load(model_file, hf=folder, dtype="fp32", lora=lora, base_dtype=base_dtype, tp=tp)
    elif lora is not None or base_dtype is not None:
        if lora is None or not any(p.is_adapter for p in model.model.params()):
            raise _error("lora= and base_dtype= need the checkpoint folder: adapters are added and the base stored "
                     "before the weights are allocated",
                         "give the folder (modeldsl.train('DIR', ..., lora=...)), or load the model with "
                         "modeldsl.load(..., lora=...)")
    if model.record.source is None:
        raise _error("the model has no checkpoint (random weights): its tokenizer is unknown",
                     "load it with hf=DIR, or give the checkpoint folder")
    folder = Path(model.record.source)
    tokenizer = Tokenizer(folder)
    eos = eos_id(folder, tokenizer)
    read = TrainingData.read(data, folder, tokenizer, eos, seq)
    evaluated = TrainingData.read(eval_data, folder, tokenizer, eos, seq) if eval_data is not None else None
    config = AdamWConfig(lr=float(lr), weight_decay=weight_decay, warmup_steps=warmup, total_steps=steps,
                         min_lr_ratio=min_lr_ratio, clip_norm=clip)
    return TrainingRun(model, read, steps, batch, seq, config, grad_accum, dtype, recompute, seed, list(callbacks),
                       evaluated, eval_every, packing=packing, dp=dp, zero=zero, tp=tp)
