"""Config of the tabular simulator (:mod:`simulators.tabular.runner`): one dataclass, validated with full dotted keys."""

from __future__ import annotations

import dataclasses

from stare_lab.config import LossConfig, STAREConfig, check_choice, check_positive, check_range, config_prefix, join_key
from stare_lab.errors import ConfigError

from simulators.presets import METHODS, SEED_MAX, method_overrides

__all__ = ["TabularSimConfig", "EXPECTED_METHODS", "LR_MAX", "resolve_target_entropy"]

#: the largest tabular ``lr``: the presets step at 0.2-2 and lr 10 is already far outside the first-order regime
#: (one step collapses a position); beyond ~1e150 the logged first-order predictions (which scale with lr) overflow
#: in the run's summary statistics, so values up to 1e3 are allowed and larger ones refused
LR_MAX = 1e3

#: methods whose mean-field dynamics :mod:`simulators.tabular.expected` implements
EXPECTED_METHODS = ("grpo", "grpo-ds", "o1", "c2", "o1-adaptive", "o1-auto", "c2-auto", "entropy_bonus")


def resolve_target_entropy(data: dict, explicit_target: bool, explicit_rel: bool) -> dict:
    """Reconcile a user's ``loss.stare.target_entropy`` (absolute, nats) with ``target_entropy_rel`` (relative to
    the reward-optimal entropy) in a nested config dict (``data``: the preset's overrides with the user's applied;
    mutated and returned).

    A preset may set ``target_entropy_rel``, which would replace any target given directly. So an explicit target
    (``explicit_target``: the user set ``loss.stare.target_entropy``) switches the relative one off
    (``target_entropy_rel = None``) unless the user also set ``target_entropy_rel`` (``explicit_rel``) — then both
    cannot hold and, unless it was set to null, this raises.

    Raises:
        ConfigError: both keys given by the user with a non-null ``target_entropy_rel`` (one line naming both).
    """
    if not explicit_target:
        return data
    rel = data.get("target_entropy_rel")
    if explicit_rel and rel is not None:
        target = ((data.get("loss") or {}).get("stare") or {}).get("target_entropy")
        raise ConfigError(
            f"loss.stare.target_entropy={target!r} and target_entropy_rel={rel!r} both set the STARE target "
            "entropy: give one of them (or target_entropy_rel=null with an explicit target)"
        )
    data["target_entropy_rel"] = None
    return data


@dataclasses.dataclass
class TabularSimConfig:
    """One tabular simulation run (one method, one seed). Every default is here and lands in ``config.yaml``; the
    defaults are the ``collapse`` preset (simulators.presets).

    Attributes:
        method: one of :data:`simulators.presets.METHODS`; sets ``loss.loss_mode``, the STARE variant /
            adaptive flag, ``dynamic_sampling`` and (``entropy_bonus``) ``loss.entropy_coeff``.
        seed: integer in [0, 2**31 − 1]: RNG seed of the rollouts (sampling stream seeded with 2**32 + seed) and, unless ``init_seed`` is
            set, of the initial logits and correct sets; the same seed gives the same start for every method.
        init_seed: seed (in [0, 2**31 − 1]) of the initial logits / correct sets if not ``seed`` (same start, different rollouts).
        mode: ``sampled`` (G rollouts per prompt, the core's advantages / STARE weights / loss) or ``expected``
            (the mean-field limit G → ∞).
        task: ``sequence`` (L positions), ``bandit`` (requires ``seq_len = 1``) or ``forking`` (an LLM-like
            token-entropy structure, :mod:`simulators.tabular.tasks`: ``forking_positions`` of the L positions per
            prompt fork between ``num_correct`` correct tokens, the others have one correct token and start nearly
            deterministic; Zipf-like initial probabilities; ``init_spread`` is not used).
        reward: ``verifiable`` (reward 1 iff ≥ threshold positions are correct) or ``random`` (Bernoulli).
        num_prompts: S ≥ 1 prompts.
        group_size: G ≥ 2 responses per prompt (group advantages of a single response are all 0: nothing would
            learn).
        seq_len: L ≥ 1 positions per response.
        vocab_size: V ≥ 2 tokens.
        num_correct: K ∈ [1, V] correct tokens per (prompt, position).
        threshold: correct positions needed for reward 1, in [1, L]; ``None`` means L (all correct). A position
            that does not decide the reward (``reward_coupling`` < 1) always counts as correct.
        reward_coupling: c ∈ (0, 1], the fraction of positions that decide the reward: max(1, ⌊c·n + ½⌋) of the
            n positions of the table (per stratum: forks and others in ``forking``), chosen at random, keep the
            task's correct set; every other position accepts every token (a paraphrase: the advantage there is
            independent of the sampled token). 1 (the default): every position decides
            (:mod:`simulators.tabular.tasks`; docs/theory.md §8).
        random_reward_p: P(r = 1) of ``random`` rewards, in [0, 1].
        reward_noise: ε ∈ [0, 0.5]: a noisy verifier flips each ``verifiable`` reward with probability ε,
            independently of the tokens (keeps reward variance alive once a prompt is solved).
        init_spread: σ ≥ 0 of the initial logits z ~ N(0, σ²) (0 → uniform, entropy log V nats).
        forking_positions: task ``forking``: forking positions per prompt, in [0, L].
        tail_mass: task ``forking``: initial probability off the (correct) mode of a non-forking position, in (0, 1).
        zipf_exponent: task ``forking``: s ≥ 0 of the Zipf-like initial probabilities p(rank r) ∝ r^(−s) (of the
            tail of a non-forking position, of all tokens of a forking one).
        lr: SGD step size in (0, 1000] (:data:`LR_MAX`; :mod:`simulators.tabular.runner` explains its scaling).
        clip_rel: > 0 or ``None`` (the default: no clip): a gradient-norm clip relative to the run's own GRPO step.
            Each step's whole update Δz (all states of the run together) is scaled by
            min(1, clip_rel·‖Δz_GRPO‖/‖Δz‖), ‖Δz_GRPO‖ the norm of the ω ≡ 1 update of the same rollouts: the
            pushed step of a STARE run is cut to at most clip_rel × the unpushed step, as a trainer's
            ``max_grad_norm`` cuts a model's (docs/calibration.md, the clip knob). A step whose GRPO update is 0 is
            not clipped. Every first-order key of the row is of the clipped step.
        push_efficiency: e ∈ (0, 1] or ``None`` (the default: e = 1): the share of the STARE push that reaches
            the policy. A step with the gate on applies Δz_GRPO + e·((W − 1)·Δz_L+ + (M − 1)·Δz_L−) instead of the
            whole push: a phenomenological stand-in for what a model loses between its first-order push on the
            batch and its entropy on fresh samples, which a table cannot have (docs/calibration.md, the
            push-efficiency knob). The D terms and W*(t) stay those of the unscaled loss, as a model's probe
            measures them; ``stare/push_first_order`` is of the applied push.
        steps: number of updates ≥ 1.
        temperature: τ > 0 of sampling, log-probs and entropy.
        dynamic_sampling: keep only groups with non-zero reward variance (DAPO), refilling up to
            ``ds_max_rounds`` rounds of fresh rollouts; set by method ``grpo-ds``.
        ds_max_rounds: ≥ 1 sampling rounds per step under dynamic sampling.
        entropy_bonus_coeff: β > 0 used by method ``entropy_bonus`` when ``loss.entropy_coeff`` is 0.
        advantage_estimator: ``grpo``, ``dr_grpo``, ``rloo`` or ``qae`` (``stare_lab.loss.advantages``).
        target_entropy_rel: > 0 or ``None``; if set, H_tgt = rel × the reward-optimal entropy of the task
            (nats): the mean over states of ln K_state, the entropy of the policy uniform over the K correct tokens
            of every position (docs/theory.md §7; ln V per position under ``random`` rewards, where every policy is
            reward-optimal). Written into ``loss.stare.target_entropy`` of the resolved config. ``None`` (the
            default) keeps the absolute ``loss.stare.target_entropy``. Given a ``loss.stare.target_entropy`` but no
            ``target_entropy_rel``, ``stare-lab simulate`` and :func:`simulators.tabular.runner.config_from_overrides`
            set it to ``None`` (:func:`resolve_target_entropy`; both given → error). The target never depends on
            the random initial policy. A target above the reward-optimal entropy can only be held by keeping
            probability on wrong answers: :func:`simulators.tabular.runner.target_warning` says so.
        collapse_frac: a run has collapsed at the first step whose entropy is below collapse_frac × initial.
        band: half-width (nats) of the band around H_tgt counted as "in band" in the summary.
        checkpoint_every: steps between checkpoints (and one at the end), ≥ 1.
        loss: the core :class:`~stare_lab.config.LossConfig` (``loss_mode`` is set by ``method``); its default
            here has ``stare.target_entropy = 0.4`` nats (the ``collapse`` preset's target, below ln 2 = 0.693, the
            reward-optimal entropy of its 2 correct tokens per position).
    """

    method: str = "grpo"
    seed: int = 0
    init_seed: int | None = None
    mode: str = "sampled"
    task: str = "sequence"
    reward: str = "verifiable"
    num_prompts: int = 64
    group_size: int = 8
    seq_len: int = 4
    vocab_size: int = 8
    num_correct: int = 2
    threshold: int | None = 3
    reward_coupling: float = 1.0
    random_reward_p: float = 0.5
    reward_noise: float = 0.1
    init_spread: float = 1.0
    forking_positions: int = 2
    tail_mass: float = 0.01
    zipf_exponent: float = 1.0
    lr: float = 1.0
    clip_rel: float | None = None
    push_efficiency: float | None = None
    steps: int = 600
    temperature: float = 1.0
    dynamic_sampling: bool = False
    ds_max_rounds: int = 4
    entropy_bonus_coeff: float = 0.01
    advantage_estimator: str = "grpo"
    target_entropy_rel: float | None = None
    collapse_frac: float = 0.1
    band: float = 0.05
    checkpoint_every: int = 100
    loss: LossConfig = dataclasses.field(default_factory=lambda: LossConfig(stare=STAREConfig(target_entropy=0.4)))

    def __post_init__(self) -> None:
        p = config_prefix("")
        k = lambda name: join_key(p, name)  # noqa: E731
        if self.method not in METHODS:
            raise ConfigError(f"{k('method')}={self.method!r} is not one of {{{', '.join(METHODS)}}}")
        for name in ("seed", "init_seed"):
            value = getattr(self, name)
            if name == "init_seed" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
                raise ConfigError(f"{k(name)}={value!r} must be an integer in [0, {SEED_MAX}] (2**31 - 1)")
        check_choice(k("mode"), self.mode, ["sampled", "expected"])
        check_choice(k("task"), self.task, ["sequence", "bandit", "forking"])
        check_choice(k("reward"), self.reward, ["verifiable", "random"])
        for name in ("num_prompts", "group_size", "seq_len", "steps", "ds_max_rounds", "checkpoint_every"):
            check_positive(k(name), getattr(self, name), integer=True)
        check_range(k("group_size"), self.group_size, 2, None)
        check_positive(k("vocab_size"), self.vocab_size, integer=True)
        if self.vocab_size < 2:
            raise ConfigError(f"{k('vocab_size')}={self.vocab_size} must be >= 2")
        if self.task == "bandit" and self.seq_len != 1:
            raise ConfigError(f"{k('seq_len')}={self.seq_len} must be 1 for task='bandit'")
        check_positive(k("num_correct"), self.num_correct, integer=True)
        if self.num_correct > self.vocab_size:
            raise ConfigError(f"{k('num_correct')}={self.num_correct} is outside [1, vocab_size={self.vocab_size}]")
        if self.threshold is not None:
            check_positive(k("threshold"), self.threshold, integer=True)
            if self.threshold > self.seq_len:
                raise ConfigError(f"{k('threshold')}={self.threshold} is outside [1, seq_len={self.seq_len}]")
        check_range(k("reward_coupling"), self.reward_coupling, 0, 1, lo_open=True)
        check_range(k("random_reward_p"), self.random_reward_p, 0, 1)
        check_range(k("reward_noise"), self.reward_noise, 0, 0.5)
        check_range(k("init_spread"), self.init_spread, 0, None)
        check_positive(k("forking_positions"), self.forking_positions, integer=True, allow_zero=True)
        check_range(k("tail_mass"), self.tail_mass, 0, 1, lo_open=True, hi_open=True)
        check_range(k("zipf_exponent"), self.zipf_exponent, 0, None)
        if self.task == "forking":
            if self.forking_positions > self.seq_len:
                raise ConfigError(f"{k('forking_positions')}={self.forking_positions} is outside [0, seq_len={self.seq_len}]")
            if 2 * self.num_correct > self.vocab_size:
                raise ConfigError(f"{k('num_correct')}={self.num_correct}: task 'forking' draws the correct tokens of a "
                                  f"forking position from its 2*num_correct most likely ones; need <= vocab_size/2="
                                  f"{self.vocab_size // 2}")
        check_range(k("lr"), self.lr, 0, LR_MAX, lo_open=True)
        if self.clip_rel is not None:
            check_range(k("clip_rel"), self.clip_rel, 0, None, lo_open=True)
        if self.push_efficiency is not None:
            check_range(k("push_efficiency"), self.push_efficiency, 0, 1, lo_open=True)
        check_range(k("temperature"), self.temperature, 0, None, lo_open=True)
        if not isinstance(self.dynamic_sampling, bool):
            raise ConfigError(f"{k('dynamic_sampling')}={self.dynamic_sampling!r} must be true or false")
        check_range(k("entropy_bonus_coeff"), self.entropy_bonus_coeff, 0, None, lo_open=True)
        check_choice(k("advantage_estimator"), self.advantage_estimator, ["grpo", "dr_grpo", "rloo", "qae"])
        if self.target_entropy_rel is not None:
            check_range(k("target_entropy_rel"), self.target_entropy_rel, 0, None, lo_open=True)
        check_range(k("collapse_frac"), self.collapse_frac, 0, 1)
        check_range(k("band"), self.band, 0, None)
        if self.mode == "expected" and self.method not in EXPECTED_METHODS:
            raise ConfigError(
                f"{k('method')}={self.method!r} has no expected-mode dynamics; with mode='expected' use one of "
                f"{{{', '.join(EXPECTED_METHODS)}}}"
            )
        if self.mode == "expected" and self.advantage_estimator != "grpo":
            raise ConfigError(f"{k('advantage_estimator')}={self.advantage_estimator!r}: mode='expected' supports 'grpo'")
        self._apply_method(p)

    def _apply_method(self, prefix: str) -> None:
        """Set what the method implies (docs/theory.md §3–4 via :data:`METHODS`) and re-validate the loss config."""
        spec = method_overrides(self.method)
        loss = spec["loss"]
        self.loss.loss_mode = loss["loss_mode"]
        for key, value in loss.get("stare", {}).items():
            setattr(self.loss.stare, key, value)
        if spec["dynamic_sampling"]:
            self.dynamic_sampling = True
        if spec.get("entropy_bonus") and self.loss.entropy_coeff == 0:
            self.loss.entropy_coeff = self.entropy_bonus_coeff
        self.loss.validate(join_key(prefix, "loss"))

    @property
    def is_stare(self) -> bool:
        """True when the loss uses the STARE gate and W/M (its declared needs, :func:`stare_lab.loss.losses.loss_needs`):
        the run has a STARE controller."""
        from stare_lab.loss.losses import loss_needs  # here: the losses import torch, a config is validated without it

        return loss_needs(self.loss.loss_mode, self.loss).stare

    @property
    def reward_threshold(self) -> int:
        """Correct positions needed for reward 1 (``threshold`` or L)."""
        return self.seq_len if self.threshold is None else self.threshold
