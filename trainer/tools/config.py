"""The settings of tool use: :class:`ToolUseConfig` (the ``tool`` block of a trainer or evaluation config) and its
:class:`SandboxConfig` (``tool.sandbox``). Plain dataclasses with no heavy imports, so that :mod:`trainer.config`
can hold them without importing the sandbox or the rollout engines.
"""

from __future__ import annotations

import dataclasses

from stare_lab.config import check_positive, check_range, config_prefix, join_key
from stare_lab.errors import ConfigError

__all__ = ["SandboxConfig", "ToolUseConfig"]


@dataclasses.dataclass
class SandboxConfig:
    """Limits of one sandboxed code execution (the ``tool.sandbox`` block of a tool-use config).

    Attributes:
        timeout_s: wall-time limit per call, seconds (> 0). The process tree is killed with SIGKILL at the limit.
        memory_mb: address-space limit (``RLIMIT_AS``) of the interpreter, MiB (≥ 64: Python itself needs ~30).
        max_output_bytes: bytes kept of stdout and, separately, of stderr (≥ 1); the rest is read and dropped.
        workdir_mb: size of each of the two tmpfs (``/sandbox`` cwd and ``/tmp``), MiB; also the largest file the
            code may write (``RLIMIT_FSIZE``).
        site_packages: also bind the running environment's site-packages read-only (numpy, sympy, … importable).
        max_workers: sandboxes run concurrently by :func:`run_many` (≥ 1).
        max_processes: processes + threads allowed inside one sandbox (cgroup ``pids.max``, ≥ 1; see the module
            docstring for where it applies).
    """

    timeout_s: float = 10.0
    memory_mb: int = 1024
    max_output_bytes: int = 8192
    workdir_mb: int = 64
    site_packages: bool = True
    max_workers: int = 4
    max_processes: int = 64

    def __post_init__(self) -> None:
        p = config_prefix("sandbox")
        p = p + "." if p else ""
        check_range(f"{p}timeout_s", self.timeout_s, 0, None, lo_open=True)
        check_positive(f"{p}memory_mb", self.memory_mb, integer=True)
        check_range(f"{p}memory_mb", self.memory_mb, 64, None)
        check_positive(f"{p}max_output_bytes", self.max_output_bytes, integer=True)
        check_positive(f"{p}workdir_mb", self.workdir_mb, integer=True)
        check_positive(f"{p}max_workers", self.max_workers, integer=True)
        check_positive(f"{p}max_processes", self.max_processes, integer=True)


@dataclasses.dataclass
class ToolUseConfig:
    """Multi-turn tool use (the ``tool`` block of a tool-use trainer config).

    Attributes:
        max_tool_calls: code executions per response (≥ 0); afterwards the model must finish without tools.
        max_rounds: generation rounds per response (≥ ``max_tool_calls + 1``), continuations included; the last
            round runs without the stop string.
        code_open: string that opens a code block (ReTool/SimpleTIR: ```` ```python ````; or ``<code>``).
        code_close: string that closes it; used as the engine's stop string.
        interpreter_template: the interpreter turn appended after a call; ``{output}`` is the formatted output.
        max_output_chars: characters of output kept in the interpreter turn (the rest is cut, with a marker).
        sandbox: limits of each execution (:class:`~trainer.tools.sandbox.SandboxConfig`).
    """

    max_tool_calls: int = 4
    max_rounds: int = 10
    code_open: str = "```python"
    code_close: str = "```"
    interpreter_template: str = "\n<interpreter>\n{output}\n</interpreter>\n"
    max_output_chars: int = 1024
    sandbox: SandboxConfig = dataclasses.field(default_factory=SandboxConfig)

    def __post_init__(self) -> None:
        prefix = config_prefix("tool")
        p = prefix + "." if prefix else ""
        check_positive(f"{p}max_tool_calls", self.max_tool_calls, integer=True, allow_zero=True)
        check_positive(f"{p}max_rounds", self.max_rounds, integer=True)
        if self.max_rounds < self.max_tool_calls + 1:
            raise ConfigError(
                f"{p}max_rounds={self.max_rounds} is below {p}max_tool_calls + 1 = {self.max_tool_calls + 1}"
            )
        for key in ("code_open", "code_close"):
            value = getattr(self, key)
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{p}{key}={value!r} must be a non-empty string")
        if "{output}" not in self.interpreter_template:
            raise ConfigError(f"{p}interpreter_template={self.interpreter_template!r} must contain {{output}}")
        check_positive(f"{p}max_output_chars", self.max_output_chars, integer=True)
        if not isinstance(self.sandbox, SandboxConfig):  # (a SandboxConfig validates itself on construction)
            raise ConfigError(f"{join_key(prefix, 'sandbox')} must be a mapping of SandboxConfig fields")
