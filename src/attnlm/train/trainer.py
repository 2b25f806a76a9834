"""The training loop: micro-batches, accumulation, clipping, schedule, evaluation, checkpoints.

Works with any model family: batches come from the objective's
:class:`~attnlm.loading.objectives.BatchSource` (dicts of tensors the trainer never looks into) and
``model(**batch)`` returns ``loss_sum`` and ``n_targets`` (:mod:`attnlm.models.base`). One
optimizer step:

1. draw the random choices for ``batch_size * micro_steps * world_size`` examples from the data
   generator (every rank draws the same numbers) and take this rank's slice for each
   micro-step; collate the micro-batches;
2. count the step's targets over all micro-batches and ranks, and backpropagate each
   micro-batch's ``loss_sum / targets`` (times the number of ranks, which DDP averages over),
   so every target of the step weighs the same whatever the objective; under DDP gradients are
   all-reduced only on the last micro-step (``no_sync`` before it), under FSDP
   (:mod:`attnlm.train.fsdp`) reduce-scattered only then;
3. stop with a message if the loss is NaN or infinite (the last good checkpoint stays);
4. clip the global gradient norm, set the learning rate, step AdamW.

A model fitted in closed form rather than by gradients brings its own step
(``TrainJob.fit_step``, e.g. the HMM's Baum-Welch iteration with ``train.hmm_em``,
:meth:`attnlm.models.hmm.HMMLM.fit_step`): it sees every window of the training split in order
and returns the step's loss per token and its token count; no optimizer, no learning rate.

Sources that keep a position between draws (``BatchSource.state_dict``) and models that carry
state between batches (``model.carry_state()`` / ``load_carry_state``, e.g. recurrent hidden
states over stateful streams, gathered from every rank) are saved in ``state.pt`` too, so a
resumed run continues exactly.

Every ``eval_interval`` steps and at the end: validation estimate, early-stopping bookkeeping,
and an atomic checkpoint (rank 0; with early stopping only when validation improved, so the
checkpoint holds the best model; under FSDP every rank writes its shards,
:func:`attnlm.train.fsdp.save_sharded`). Logged records go to ``metrics.jsonl`` (JSON lines); on
resume, records after the checkpoint's step are dropped so the log matches an uninterrupted run.
A fine-tune's new run also evaluates before its first step (the "before" of its result, and the
measured time that a time budget keeps for the final evaluation: :mod:`attnlm.train.budget`).
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from attnlm.base.device import autocast
from attnlm.base.errors import ConfigError
from attnlm.loading.checkpoint import CHECKPOINT_DIR, save_checkpoint
from attnlm.loading.evaluation import EvalResult, estimate, evaluate
from attnlm.loading.objectives import count_targets
from attnlm.nn import fused, grad_precision
from attnlm.train import checkpointing, fsdp
from attnlm.train import distributed as D
from attnlm.train.budget import Budget, estimated_save_s
from attnlm.train.job import MetricsLog, TrainingError, TrainJob, TrainResult, TrainState
from attnlm.train.optim import lr_at

# the run's records live in attnlm.train.job; importing them from here keeps working
__all__ = ["MetricsLog", "Trainer", "TrainJob", "TrainResult", "TrainState", "TrainingError"]


def _silent(*_args: Any) -> None:
    return None


def _fmt_time(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


RNG_KEYS = ("rng_torch", "rng_cuda")  # a process's random state in a checkpoint


def _rng_state() -> dict[str, Any]:
    """This process's random state: CPU generator, and every CUDA device's when there is one."""
    state: dict[str, Any] = {"rng_torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["rng_cuda"] = torch.cuda.get_rng_state_all()
    return state


def _setup_bf16_backward(model: torch.nn.Module, device: torch.device) -> None:
    """Check that ``--backward-precision bfloat16`` can run here (one line if not) and route
    every plain ``nn.Linear`` of ``model`` through :func:`attnlm.nn.fused.linear`, whose
    backward takes the setting (same parameters and state-dict keys)."""
    if device.type != "cpu":
        raise ConfigError(
            "--backward-precision bfloat16 is for training on the CPU; on a GPU use "
            "--dtype bfloat16 (autocast)"
        )
    why = grad_precision.bf16_backward_support()
    if why is not None:
        raise ConfigError(f"--backward-precision bfloat16: {why}")
    fused.use_onednn(model)


class Trainer:
    """Runs the loop for one :class:`TrainJob`; see the module docstring."""

    def __init__(self, job: TrainJob) -> None:
        self.job = job
        self.raw_model = job.model  # the module whose weights are saved
        self.model = job.model  # what forward() is called on (DDP / compiled wrapper)
        self.opt = job.optimizer
        self.cfg = cfg = job.config
        self.train_src, self.val_src = job.train, job.val
        self.run_dir = Path(job.run_dir)
        self.ckpt_config = job.checkpoint_config
        self.tokenizer = job.tokenizer
        self.device = job.device
        if self.device.type == "cuda":  # TF32 tensor cores for float32 matmuls (A100 and later)
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        self.bf16_backward = cfg.backward_precision == "bfloat16"
        if self.bf16_backward:
            _setup_bf16_backward(self.raw_model, self.device)
        self.dist = job.dist
        self.data_gen = job.data_gen or torch.Generator().manual_seed(cfg.seed)
        self.state = TrainState()
        self.log = job.log
        self.micro = D.local_accum(cfg.grad_accum, self.dist)
        # FSDP: the model is sharded already (fsdp.shard, before the optimizer was built)
        self.sharded = cfg.parallel == "fsdp"
        self.last_ckpt: Path | None = None
        self.step_tokens = 0  # tokens the last step trained on
        if (self.run_dir / CHECKPOINT_DIR).exists():
            self.last_ckpt = self.run_dir / CHECKPOINT_DIR

    def wrap(self, ddp: bool, compile: bool) -> None:
        """Wrap the model for DDP and/or torch.compile (weights stay in ``raw_model``)."""
        model = self.raw_model
        if compile:
            model = torch.compile(model)
        if ddp and self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            model = DistributedDataParallel(model, device_ids=ids)
        self.model = model

    # -- checkpoint state ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "trainer": self.state.to_dict(),
            **_rng_state(),
            "rng_data": self.data_gen.get_state(),
        }
        if not self.sharded:  # sharded: the optimizer state is in the shards
            out["optimizer"] = self.opt.state_dict()
        source = self.train_src.state_dict()
        if source is not None:
            out["source"] = source
        return out

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.state = TrainState(**sd["trainer"])
        if not self.sharded:
            self.opt.load_state_dict(sd["optimizer"])
        own = self._own_rng(sd)
        torch.set_rng_state(own["rng_torch"])
        self.data_gen.set_state(sd["rng_data"])
        if "rng_cuda" in own and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(own["rng_cuda"])
        if "source" in sd:
            self.train_src.load_state_dict(sd["source"])
        carry = sd.get("model_carry")
        if carry is not None and hasattr(self.raw_model, "load_carry_state"):
            if len(carry) != self.dist.world_size:
                raise ConfigError(
                    f"this run carries model state per process: resume it with "
                    f"{len(carry)} process(es), not {self.dist.world_size}"
                )
            self.raw_model.load_carry_state(carry[self.dist.rank])

    def _own_rng(self, sd: dict[str, Any]) -> dict[str, Any]:
        """This rank's saved random state (dropout and other draws in the model): a run of
        several processes saves every rank's (``rng_ranks``); with as many processes as when
        it was saved, each rank continues its own stream exactly. With another number of
        processes (or a checkpoint from before ``rng_ranks``) a rank without a saved state of
        its own continues from rank 0's, reseeded by its rank so that ranks still differ."""
        ranks = sd.get("rng_ranks")
        rank, world = self.dist.rank, self.dist.world_size
        if ranks is not None and len(ranks) == world:
            return ranks[rank]
        if rank == 0 or world == 1:
            return {k: sd[k] for k in RNG_KEYS if k in sd}
        gen = torch.Generator()
        gen.set_state(sd["rng_torch"])
        seed = int(torch.randint(2**62, (1,), generator=gen)) + rank
        torch.manual_seed(seed)  # a fresh stream per rank (and per CUDA device)
        return {"rng_torch": torch.get_rng_state()}

    def _rng_states(self) -> list[dict[str, Any]] | None:
        """Every rank's random state, gathered on every rank; None for one process (its state
        is ``rng_torch`` / ``rng_cuda``). Called by every rank."""
        return self._gather(_rng_state()) if self.dist.enabled else None

    def _carry_states(self) -> list[Any] | None:
        """Each rank's ``model.carry_state()`` (state a model carries between training
        batches, e.g. recurrent hidden states of stateful streams), gathered on every rank;
        None for models without it. Called by every rank."""
        fn = getattr(self.raw_model, "carry_state", None)
        if fn is None:
            return None
        return self._gather(fn()) if self.dist.enabled else [fn()]

    def _gather(self, mine: Any) -> list[Any]:
        """Every rank's ``mine`` (any picklable object), in rank order, on every rank."""
        gathered: list[Any] = [None] * self.dist.world_size
        torch.distributed.all_gather_object(gathered, mine)
        return gathered

    def save(self) -> Path | None:
        carry = self._carry_states()  # every rank takes part in the gathers
        rngs = self._rng_states()
        if not (self.dist.is_main or self.sharded):
            return None
        config = {**self.ckpt_config, "step": self.state.step}
        state = self.state_dict()
        if carry is not None:
            state["model_carry"] = carry
        if rngs is not None:
            state["rng_ranks"] = rngs
        path = self.run_dir / CHECKPOINT_DIR
        if self.sharded:  # every rank writes its shards
            fsdp.save_sharded(path, self.raw_model, self.opt, config, self.tokenizer, state)
        else:
            save_checkpoint(path, self.raw_model, config, self.tokenizer, state)
        self.last_ckpt = path
        return path

    # -- one optimizer step ----------------------------------------------------------------
    def _micro_batches(self) -> list[dict[str, torch.Tensor]]:
        """This rank's micro-batches of one step (see the module docstring, point 1)."""
        n, d, micro = self.cfg.batch_size, self.dist, self.micro
        draw = self.train_src.draw(n * micro * d.world_size, self.data_gen)
        shaped = {k: v.view(micro, d.world_size, n, *v.shape[1:]) for k, v in draw.items()}
        return [self.train_src.collate({k: v[m, d.rank] for k, v in shaped.items()})
                for m in range(micro)]  # fmt: skip

    def _fit_step(self) -> float:
        """The model's own step over the whole training split (``TrainJob.fit_step``)."""
        assert self.job.fit_step is not None
        windows = self.train_src.sequential(self.cfg.batch_size)
        loss, self.step_tokens = self.job.fit_step(windows)
        if not math.isfinite(loss):
            raise TrainingError(f"the loss became {loss} at step {self.state.step + 1}")
        return loss

    def _step(self, lr: float) -> float:
        cfg, d = self.cfg, self.dist
        if self.job.fit_step is not None:
            return self._fit_step()
        for group in self.opt.param_groups:
            group["lr"] = lr
        batches = self._micro_batches()
        targets = D.total(float(sum(count_targets(b) for b in batches)), d, self.device)
        scale = d.world_size / max(targets, 1.0)  # DDP averages gradients over the ranks
        summed = torch.zeros((), device=self.device)
        for m, batch in enumerate(batches):
            batch = {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}
            last = m == self.micro - 1
            sync = nullcontext() if last or not d.enabled else self._no_sync()
            with sync:
                with (
                    autocast(self.device, cfg.dtype),
                    grad_precision.bf16_backward(self.bf16_backward),
                ):
                    loss_sum = self.model(**batch).loss_sum
                (loss_sum * scale).backward()
            summed += loss_sum.detach().float()
        loss_value = D.total(float(summed), d, self.device) / max(targets, 1.0)
        if not math.isfinite(loss_value):
            self.opt.zero_grad(set_to_none=True)
            where = f"; the last good checkpoint is {self.last_ckpt}" if self.last_ckpt else ""
            raise TrainingError(
                f"the loss became {loss_value} at step {self.state.step + 1}; training stopped"
                f"{where} (try a lower learning rate)"
            )
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.raw_model.parameters(), cfg.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss_value

    def _no_sync(self) -> Any:
        """Accumulate this micro-step's gradients without communication."""
        return fsdp.no_sync(self.raw_model) if self.sharded else self.model.no_sync()

    def evaluate(self) -> EvalResult:
        """The validation estimate: ``eval_iters`` random batches, or every example once when
        the split holds no more than they would draw (a few conversations: exact, cheaper)."""
        size = getattr(self.val_src, "size", None)
        if size is not None and size() <= self.cfg.eval_iters * self.cfg.batch_size:
            return evaluate(self.raw_model, self.val_src, self.cfg.batch_size, self.device,
                            self.cfg.dtype)  # fmt: skip
        return estimate(
            self.raw_model,
            self.val_src,
            self.cfg.eval_iters,
            self.cfg.batch_size,
            self.device,
            self.cfg.dtype,
            seed=self.cfg.seed + 1,
        )

    def _time_fraction(self, budget: Budget) -> float:
        """Elapsed fraction of the loop's share of the wall-clock budget (rank 0's clock on
        every rank; :mod:`attnlm.train.budget`)."""
        if not budget.seconds:
            return 0.0
        return D.from_main([budget.fraction()], self.dist, self.device)[0]

    def _start_budget(self, t0: float) -> Budget:
        """The run's :class:`~attnlm.train.budget.Budget`, its save time estimated from what a
        checkpoint holds (the trained tensors and their AdamW state)."""
        cfg = self.cfg
        budget = Budget(cfg.time_budget_s, t0, cfg.eval_iters, self.micro)
        trained = sum(p.numel() for p in self.raw_model.parameters() if p.requires_grad)
        budget.save_estimate = estimated_save_s(trained)
        return budget

    def _first_eval(self, metrics: MetricsLog, write: Any, budget: Budget) -> EvalResult:
        """A fine-tune's starting model on the validation split, before any step: the
        "before" of its result, and the measured time its final evaluation will take."""
        t = time.perf_counter()
        ev = self.evaluate()
        budget.eval_s = time.perf_counter() - t
        self.state.elapsed = budget.elapsed()
        metrics.write({"step": 0, "val_loss": ev.loss, "val_bpc": ev.bpc, "val_ppl": ev.ppl,
                       "val_accuracy": ev.accuracy,
                       "elapsed": round(self.state.elapsed, 3)})  # fmt: skip
        what = f", {ev.bpc:.4f} bits/char" if ev.bpc is not None else ""
        write(f"before training: val loss {ev.loss:.4f}{what} ({budget.eval_s:.1f} s)")
        return ev

    # -- the loop --------------------------------------------------------------------------
    def _progress_bar(self) -> tuple[Any, Any]:
        """``(bar, write)``: the progress bar (rank 0 with ``progress``) and the function that
        prints a line beside it (silent on the other ranks)."""
        from tqdm.auto import tqdm

        cfg, st, d = self.cfg, self.state, self.dist
        # The bar shows the run's progress in percent: the larger of the step and time fractions.
        bar = tqdm(
            total=100.0,
            initial=100.0 * st.step / cfg.max_iters,
            disable=not (cfg.progress and d.is_main),
            dynamic_ncols=True,
            mininterval=0.5,
            bar_format="{desc}{percentage:3.0f}%|{bar}| [{elapsed}{postfix}]",
            desc="train ",
        )
        if not d.is_main:
            write = _silent
        else:
            write = bar.write if not bar.disable else self.log
        return bar, write

    def _show_progress(self, bar: Any, loss_ema: float, tok_s: float) -> None:
        """Move the bar to the run's progress and show the step, smoothed loss, speed and ETA."""
        cfg, st = self.cfg, self.state
        budget = cfg.time_budget_s
        left = (cfg.max_iters - st.step) * (st.elapsed / max(st.step, 1))
        if budget:
            left = min(left, budget - st.elapsed)
        bar.set_postfix_str(
            f"step {st.step}, loss {loss_ema:.4f}, {tok_s:,.0f} tok/s, ETA {_fmt_time(left)}",
            refresh=False,
        )
        progress = 100.0 * max(st.step / cfg.max_iters, st.elapsed / budget if budget else 0)
        bar.update(min(progress, 100.0) - bar.n)

    def _evaluate_and_save(
        self, loss: float, lr: float, budget: Budget, metrics: MetricsLog, write: Any
    ) -> tuple[EvalResult, bool]:
        """``(result, early)``: one evaluation, logged, with its checkpoint (with early stopping
        only when validation improved) and whether early stopping ends the run now."""
        cfg, st, d = self.cfg, self.state, self.dist
        t = time.perf_counter()
        last_eval = self.evaluate()
        budget.eval_s = time.perf_counter() - t
        improved = last_eval.loss < st.best_val
        if improved:
            st.best_val, st.bad_evals = last_eval.loss, 0
        else:
            st.bad_evals += 1
        metrics.write(
            {
                "step": st.step,
                "val_loss": last_eval.loss,
                "val_bpc": last_eval.bpc,
                "val_ppl": last_eval.ppl,
                "val_accuracy": last_eval.accuracy,
                "train_loss": loss,
                "elapsed": round(st.elapsed, 3),
            }
        )
        per_char = (
            f"val {last_eval.bpc:.4f} bits/char"
            if last_eval.bpc is not None
            else f"val accuracy {last_eval.accuracy or 0:.2%}"
        )
        write(
            f"step {st.step}: train loss {loss:.4f}, val loss {last_eval.loss:.4f}, "
            f"{per_char}" + ("" if self.job.fit_step else f", lr {lr:.2e}")
        )
        st.elapsed = budget.elapsed()
        keep = improved or not cfg.early_stop  # with early stopping: the best
        if D.from_main([float(keep)], d, self.device)[0]:  # saving is collective
            t = time.perf_counter()
            self.save()
            budget.save_s = time.perf_counter() - t
            st.elapsed = budget.elapsed()
        early = cfg.early_stop and st.bad_evals >= cfg.early_stop
        if D.from_main([float(bool(early))], d, self.device)[0]:
            write(f"early stop: no improvement in {cfg.early_stop} evaluations")
            return last_eval, True
        return last_eval, False

    def _begin(self, metrics: MetricsLog, write: Any, window: int) -> tuple[Budget, Any]:
        """Before the first step of a session: gradient checkpointing chosen (and said), the
        budget's clock started (this session's setup counted), a fine-tune's starting model
        evaluated. Returns the budget and that first evaluation (or None)."""
        cfg, st = self.cfg, self.state
        ckpt = checkpointing.setup(self.raw_model, cfg.grad_checkpoint, cfg.batch_size, window,
                                   self.device)  # fmt: skip
        if ckpt.on or cfg.grad_checkpoint == "auto" and checkpointing.supported(self.raw_model):
            write(f"gradient checkpointing {ckpt.why}")
        now = time.perf_counter()
        setup = now - self.job.started if self.job.started is not None else 0.0
        budget = self._start_budget(now - st.elapsed - setup)
        first_eval = None
        if cfg.init_from and st.step == 0 and self.job.fit_step is None:
            first_eval = self._first_eval(metrics, write, budget)
        if budget.seconds:
            write(budget.describe())
        return budget, first_eval

    def fit(self, metrics: MetricsLog) -> TrainResult:
        """Run the loop until ``max_iters``, the time budget or early stopping, logging to
        ``metrics``; returns the run's result. Each session takes at least one step; a
        fine-tune's new run evaluates its starting model first (``TrainResult.first_eval``)."""
        cfg, st, d = self.cfg, self.state, self.dist
        per_example = self.train_src.tokens_per_example()
        self.step_tokens = cfg.batch_size * self.micro * d.world_size * per_example
        bar, write = self._progress_bar()
        budget, first_eval = self._begin(metrics, write, per_example)
        session_t0, session_steps = time.perf_counter(), 0
        last_eval: EvalResult | None = None
        stop_reason = "max_iters"
        loss_ema: float | None = None
        tok_s = 0.0
        frac = self._time_fraction(budget)
        try:
            while st.step < cfg.max_iters and not (session_steps and frac >= 1.0):
                lr = lr_at(st.step, cfg, frac)
                t_step = time.perf_counter()
                loss = self._step(lr)
                budget.took_step(time.perf_counter() - t_step)
                st.step += 1
                st.tokens += self.step_tokens
                session_steps += 1
                st.elapsed = budget.elapsed()
                loss_ema = loss if loss_ema is None else 0.9 * loss_ema + 0.1 * loss
                tok_s = session_steps * self.step_tokens / (time.perf_counter() - session_t0)
                self._show_progress(bar, loss_ema, tok_s)
                if st.step % cfg.log_interval == 0 or st.step == 1:
                    metrics.write({"step": st.step, "loss": loss, "lr": lr, "tokens_per_s":
                                   round(tok_s, 1), "elapsed": round(st.elapsed, 3)})  # fmt: skip
                frac = self._time_fraction(budget)
                final = st.step >= cfg.max_iters or frac >= 1.0
                if frac >= 1.0:  # saved with the final checkpoint: a resume needs more time
                    st.budget_stop = budget.seconds or 0.0
                if st.step % cfg.eval_interval == 0 or final:
                    last_eval, early = self._evaluate_and_save(loss, lr, budget, metrics, write)
                    if early:
                        stop_reason = "early_stop"
                        break
                if self.job.on_step is not None:
                    self.job.on_step(st.step)
        finally:
            bar.close()
        if stop_reason == "max_iters" and st.step < cfg.max_iters:
            stop_reason = "time_budget"
        return TrainResult(
            step=st.step,
            stop_reason=stop_reason,
            elapsed=st.elapsed,
            tokens_per_s=tok_s,
            last_eval=last_eval,
            checkpoint=self.last_ckpt,
            history=metrics.records,
            first_eval=first_eval,
        )
