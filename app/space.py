"""Space mode: what an anonymous visitor of a public Hugging Face Space may do, and who owns which run.

A Space (``SPACE_ID`` set) is public by design, so every action that costs compute, disk or someone else's
work is checked here, by who asks (``gr.Request.session_hash``, one per page load or gradio_client):

* **Caps** (:func:`check_space_config`): the final config of a visitor's run, after every form field and
  ``key=value`` override, is compared field by field with the shipped tiny-shapes setting. Fields that cost
  compute have a cap (:data:`CAPS`, :data:`MIN_EVERY`); the backbone, every path and option mapping, and any
  other field not in :data:`TUNABLE` must keep the shipped value. A field added to the config later is
  therefore fixed until it is listed here. The caps live in this module, not in the config, so no override
  can change them.
* **Ownership** (:class:`SpaceGuard`): a visitor may cancel, resume and delete only the runs their session
  started; the owner may act on every run and is not held to the caps. The owner is the Space's author
  (``SPACE_AUTHOR_NAME``, set by the Space runtime) signed in with Hugging Face (OAuth, ``hf_oauth: true`` in
  README's front matter: :meth:`SpaceGuard.login_oauth`); the password of the Space secret
  ``JAGG_OWNER_PASSWORD`` is a fallback (:meth:`SpaceGuard.login`), limited per session and per client
  address, with no Space-wide pause, so that guessing never locks the owner out. The showcase runs are
  read-only for everyone.
* **Queue limits**: at most ``per_visitor`` waiting-or-training runs per visitor session and ``total`` in all.
* **Pruning**: when the visitor runs pass ``max_visitor_runs`` in number or ``max_visitor_bytes`` in size, or
  the runs folder passes ``max_runs_bytes``, the oldest finished visitor runs are deleted with their folders
  (never the owner's, never the showcase, never an active run). The Space header says so
  (:meth:`SpaceLimits.describe_disk`).
* **Files** (:class:`FilePublisher`): gradio's file route serves only what the app handed to a component
  (copied into gradio's cache): sample images and the exports a visitor asked for. The runs folder itself
  is never an allowed path, so ``jagg.db``, checkpoints and logs are never served (a runs folder gradio
  cannot reach hands it copies of the images, bounded by :data:`PUBLIC_MAX_BYTES`). A visitor's reports and
  exports are written inside gradio's cache (so gradio serves them without another copy) and pruned by
  :func:`prune_exports` to :data:`EXPORTS_PER_SESSION` files a session and :data:`EXPORTS_MAX_BYTES` in all.

Local mode (no ``SPACE_ID``): whoever reaches the app is the owner (``--auth`` protects it); only the
showcase is read-only. No torch here.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import hashlib
import hmac
import json
import os
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from jagg_engine.store import RunStore, StoreError
from jagg_engine.train.config import ConfigError, TrainConfig

OWNER_PASSWORD_ENV = "JAGG_OWNER_PASSWORD"
SPACE_AUTHOR_ENV = "SPACE_AUTHOR_NAME"  # set by the Space runtime: the user or organisation owning the Space
OAUTH_ENV = "OAUTH_CLIENT_ID"  # set by the Space runtime when README's front matter has hf_oauth: true
# A visitor's reports and exports (app.handlers): the newest EXPORTS_PER_SESSION files of each session are kept,
# and the oldest files of all sessions go while the folder is over EXPORTS_MAX_BYTES (a file just written
# is always kept, so the folder holds at most EXPORTS_MAX_BYTES plus the newest file).
EXPORTS_PER_SESSION = 4
EXPORTS_MAX_BYTES = 64 * 1024**2
# The publisher's copies of run images (a runs folder gradio cannot reach): checked after every eighth of it
# copied, past this size the oldest copies go, down to half of it (a copy gone is made again when shown again).
PUBLIC_MAX_BYTES = 256 * 1024**2
DATA_DIR = Path("/data")  # a Space's persistent storage, when the Space has it
DATA_RUNS_NAME = "jagg-runs"

SPACE_BACKBONES = ("tiny-shapes",)
# Weight-free rewards: cheap, and nothing to download.
SPACE_REWARDS = (
    "shapes",
    "shapes-dense",
    "brightness",
    "colorfulness",
    "jpeg_compressibility",
    "jpeg_incompressibility",
)
MAX_REWARDS = 4
MAX_NAME_CHARS = 64
# Upper bounds of the fields that scale the compute (or memory) of a run; eval_seeds is a count of seeds.
# At these values a run is the shipped tiny-shapes setting cut to 30 steps (about 10 minutes on 2 CPU cores).
CAPS: dict[str, int] = {
    "steps": 30,
    "group_size": 8,
    "prompts_per_step": 18,
    "sampling_steps": 12,
    "eval_num_prompts": 90,
    "eval_seeds": 2,
    "processes": 1,
    "lora_rank": 64,
}
# Periodic work (evals, sample images, probes, checkpoints): 0 (never) or at least this many steps apart.
MIN_EVERY: dict[str, int] = {
    "eval_every": 5,
    "sample_every": 5,
    "probe_every": 5,
    "auto_route_every": 5,
    "checkpoint_every": 10,
}
# Fields that name files or folders, or carry options that may: only the shipped value (none).
PATH_FIELDS = (
    "model_path",
    "prompts_file",
    "eval_prompts_file",
    "output_dir",
    "backbone_options",
    "reward_options",
)
# Fields a visitor may set freely (the config's own validation bounds them; none changes the cost much).
TUNABLE = (
    "name",
    "seed",
    "algorithm",
    "eta",
    "shift",
    "sde_window_start",
    "sde_window_end",
    "cfg_scale",
    "strategy",
    "window",
    "jagg_frac",
    "cv_frac",  # at most the exact backward's cost (cv_frac = 1)
    "far_credit",  # JAGG's cost either way
    "jagg_until_step",
    "jagg_from_step",
    "switch_to",  # exact (the baseline's cost) or pair (JAGG's)
    "pair_cv",  # JAGG's cost either way
    "pair_frac",  # JAGG's cost either way
    "endpoint_backward",
    "auto_route",
    "auto_route_threshold",
    "reuse_rollout_velocity",
    "lr",
    "weight_decay",
    "grad_clip",
    "clip_range",
    "adv_clip",
    "adv_std",
    "beta",
    "lora_alpha",
    # the windowed schedules (README, "Windowed GRPO"): none costs more than the shipped window; the ODE step
    # counts are capped at the schedule's own
    "sde_window_schedule",
    "window_shift_every",
    "window_stride",
    "window_last_start",
    "group_noise",
    "ode_solver",
    "ode_steps_before",
    "ode_steps_after",
)


class SpaceError(ValueError):
    """An action this visitor may not take (not theirs, queue full, not logged in); one line."""


def space_mode_from_env(env: Mapping[str, str] | None = None) -> bool:
    """A Hugging Face Space sets SPACE_ID in the environment."""
    return bool((os.environ if env is None else env).get("SPACE_ID"))


def oauth_from_env(env: Mapping[str, str] | None = None) -> bool:
    """Sign-in with Hugging Face is on: the Space runtime sets OAUTH_CLIENT_ID when README's front matter
    has ``hf_oauth: true``."""
    return bool((os.environ if env is None else env).get(OAUTH_ENV))


def default_runs_dir(space: bool, data_dir: Path = DATA_DIR) -> str:
    """``<data_dir>/jagg-runs`` on a Space with persistent storage (a writable ``/data``), else ``runs``
    (beside the app, lost when a Space restarts without persistent storage)."""
    if space and data_dir.is_dir() and os.access(data_dir, os.W_OK):
        return str(data_dir / DATA_RUNS_NAME)
    return "runs"


# ---------------------------------------------------------------------------------------------- caps


def check_space_config(cfg: TrainConfig, base: TrainConfig | None = None) -> None:
    """Raise ConfigError (one line naming the field) if ``cfg`` is not a run a visitor may start.

    ``base`` is the shipped setting (TrainConfig() defaults, the tiny-shapes CPU config); every field is
    checked, so a form field and a ``key=value`` override are held to the same rule.
    """
    base = base or TrainConfig()
    values, shipped = cfg.to_dict(), base.to_dict()
    if values["backbone"] not in SPACE_BACKBONES:
        raise ConfigError(
            f"backbone: this Space offers only {', '.join(SPACE_BACKBONES)}, got {values['backbone']!r}"
        )
    for key in PATH_FIELDS:
        if values[key] != shipped[key]:
            raise ConfigError(
                f"{key}: this Space accepts no file or folder paths (nor options), got {values[key]!r}"
            )
    if len(values["name"]) > MAX_NAME_CHARS:
        raise ConfigError(
            f"name: this Space allows at most {MAX_NAME_CHARS} characters, got {len(values['name'])}"
        )
    rewards = values["rewards"]
    unknown = [name for name in rewards if name not in SPACE_REWARDS]
    if unknown:
        raise ConfigError(
            f"rewards: this Space offers only the weight-free rewards {', '.join(SPACE_REWARDS)}, got {unknown[0]!r}"
        )
    if len(rewards) > MAX_REWARDS:
        raise ConfigError(f"rewards: this Space allows at most {MAX_REWARDS} rewards, got {len(rewards)}")
    for key, cap in CAPS.items():
        value = values[key]
        amount = len(value) if isinstance(value, (list, tuple)) else value
        if amount > cap:
            what = f"{cap} seeds" if key == "eval_seeds" else str(cap)
            raise ConfigError(f"{key}: this Space allows at most {what}, got {amount}")
    for key, least in MIN_EVERY.items():
        value = values[key]
        if value != 0 and value < least:
            raise ConfigError(f"{key}: this Space allows 0 (never) or at least {least} steps, got {value}")
    checked = {"backbone", "rewards", *PATH_FIELDS, *CAPS, *MIN_EVERY, *TUNABLE}
    for key, value in values.items():
        if key not in checked and value != shipped[key]:
            raise ConfigError(f"{key}: this Space keeps the shipped value {shipped[key]!r}, got {value!r}")


# ---------------------------------------------------------------------------------------------- limits


@dataclasses.dataclass(frozen=True)
class SpaceLimits:
    """Queue and disk limits of a Space (environment: JAGG_SPACE_QUEUE_PER_VISITOR, JAGG_SPACE_QUEUE_TOTAL,
    JAGG_SPACE_MAX_RUNS_MB, JAGG_SPACE_MAX_VISITOR_RUNS, JAGG_SPACE_MAX_VISITOR_RUNS_MB)."""

    per_visitor: int = 2  # waiting or training runs of one visitor session (a compare pair is 2)
    total: int = 4  # waiting or training runs of all visitors together
    max_runs_bytes: int = 2048 * 1024**2  # the runs folder is pruned above this size
    max_visitor_runs: int = (
        12  # visitor runs kept (a tiny-shapes run is ~30 MB); the oldest finished go first
    )
    max_visitor_bytes: int = 512 * 1024**2  # bytes of the visitor runs' folders kept together
    prune_every_s: float = 30.0  # the folder size is measured at most this often

    def describe_disk(self) -> str:
        """The Space header's sentence on what is kept of visitor runs."""
        return (
            f"The newest {self.max_visitor_runs} visitor runs are kept ({self.max_visitor_bytes / 1024**2:.0f} MB"
            " together at most): past that the oldest finished ones are deleted, never the showcase or the"
            " owner's runs."
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SpaceLimits:
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for name, field, scale in (
            ("JAGG_SPACE_QUEUE_PER_VISITOR", "per_visitor", 1),
            ("JAGG_SPACE_QUEUE_TOTAL", "total", 1),
            ("JAGG_SPACE_MAX_RUNS_MB", "max_runs_bytes", 1024**2),
            ("JAGG_SPACE_MAX_VISITOR_RUNS", "max_visitor_runs", 1),
            ("JAGG_SPACE_MAX_VISITOR_RUNS_MB", "max_visitor_bytes", 1024**2),
        ):
            text = env.get(name)
            if text is None or text == "":
                continue
            try:
                number = int(text)
                if number < 1:
                    raise ValueError
            except ValueError:
                raise ValueError(f"{name}: must be an integer >= 1, got {text!r}") from None
            values[field] = number * scale
        return cls(**values)


def folder_size(path: Path) -> int:
    """Bytes of the regular files under ``path`` (symlinks not followed)."""
    total = 0
    stack = [path]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    total += entry.stat(follow_symlinks=False).st_size
            except OSError:
                continue
    return total


# ---------------------------------------------------------------------------------------------- ownership


class SpaceGuard:
    """Who may do what with which run. One per app; thread-safe.

    Which session started which run is kept in ``<runs_dir>/space-runs.json`` (so pruning still knows the
    visitor runs after a restart); owner sessions only in memory (a restart logs the owner out).
    """

    LOGIN_TRIES_PER_SESSION = 5
    LOGIN_FAILURES_PER_CLIENT = 10  # wrong passwords from one client address in LOGIN_WINDOW_S
    LOGIN_WINDOW_S = 600.0
    _MAX_TRACKED = 10_000  # sessions and client addresses remembered for the limits (oldest forgotten)

    def __init__(
        self,
        runs_dir: str | os.PathLike[str],
        space: bool,
        owner_password: str | None = None,
        limits: SpaceLimits | None = None,
        read_only: Iterable[int] = (),
        owner_name: str | None = None,
    ):
        self.root = Path(runs_dir).resolve()
        self.space = space
        self._password = owner_password or None
        self.owner_name = (owner_name or "").strip() or None
        self.limits = limits or SpaceLimits()
        self.read_only = set(read_only)
        self._file = self.root / "space-runs.json"
        self._runs: dict[int, dict[str, Any]] = self._load()
        self._owners: set[str] = set()
        self._tries: dict[str, int] = {}
        self._failures: dict[str, deque[float]] = {}  # client address → times of its wrong passwords
        self._last_prune = 0.0
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ sessions and login
    def is_owner(self, session: str | None) -> bool:
        return not self.space or (bool(session) and session in self._owners)

    def login_oauth(self, session: str | None, username: str | None) -> str:
        """Give this session owner rights if ``username`` (from the Hugging Face sign-in, gradio's
        OAuthProfile) is the Space's author; never limited by wrong passwords. The reply is one line."""
        if not self.space:
            return "Not a Space: whoever reaches this app already has owner rights."
        if not session or not username:
            return ""
        if not self.owner_name:
            return f"Signed in; the Space's author is unknown ({SPACE_AUTHOR_ENV} is not set)."
        if username.casefold() != self.owner_name.casefold():
            return "Signed in with Hugging Face; owner rights are for the Space's author only."
        with self._lock:
            self._owners.add(session)
        return "Signed in with Hugging Face as the Space's author: owner rights for this session."

    def login(self, session: str | None, password: str | None, client: str | None = None) -> str:
        """Give this session owner rights if ``password`` is the owner's; the reply is one line.

        Wrong passwords are limited per session (LOGIN_TRIES_PER_SESSION) and per client address
        (LOGIN_FAILURES_PER_CLIENT in LOGIN_WINDOW_S), never Space-wide: a guesser locks out only itself, and
        the owner signs in with Hugging Face (:meth:`login_oauth`) or from another address."""
        if not self.space:
            return "Not a Space: whoever reaches this app already has owner rights."
        if not self._password:
            return f"Owner login is off: set the Space secret {OWNER_PASSWORD_ENV} to turn it on."
        if not session:
            return "Owner login needs a browser or gradio_client session."
        if not isinstance(password, str):
            return "Wrong password."
        with self._lock:
            now = time.time()
            client = client or "?"
            failures = self._failures.get(client, deque())
            while failures and now - failures[0] > self.LOGIN_WINDOW_S:
                failures.popleft()
            if len(failures) >= self.LOGIN_FAILURES_PER_CLIENT:
                wait = max(1, round((self.LOGIN_WINDOW_S - (now - failures[0])) / 60))
                return (
                    f"Too many wrong passwords from this address; try again in {wait} minute(s), or sign in"
                    " with Hugging Face."
                )
            if self._tries.get(session, 0) >= self.LOGIN_TRIES_PER_SESSION:
                return "Too many wrong passwords in this session; reload the page to try again."
            if hmac.compare_digest(password.encode(), self._password.encode()):
                self._owners.add(session)
                self._tries.pop(session, None)
                return "Logged in as the owner for this session."
            self._tries[session] = self._tries.get(session, 0) + 1
            failures.append(now)
            self._failures[client] = failures
            for table in (self._tries, self._failures):  # bounded memory under a flood of sessions
                while len(table) > self._MAX_TRACKED:
                    table.pop(next(iter(table)))
            return "Wrong password."

    # ------------------------------------------------------------------ who started what
    def record(self, session: str | None, run_ids: Iterable[int]) -> None:
        """Remember that ``session`` started these runs (as the owner or as a visitor)."""
        with self._lock:
            owner = self.is_owner(session)
            for run_id in run_ids:
                self._runs[int(run_id)] = {
                    "session": _session_key(session),
                    "owner": owner,
                    "at": time.time(),
                }
            self._save()

    def started_by(self, session: str | None, run_id: int) -> bool:
        entry = self._runs.get(int(run_id))
        return bool(session) and entry is not None and entry["session"] == _session_key(session)

    def check_action(self, session: str | None, run_id: int, action: str) -> None:
        """Raise SpaceError unless this session may ``action`` (cancel | resume | delete) run ``run_id``."""
        if run_id in self.read_only:
            raise SpaceError(f"{action}: run {run_id} is the shipped showcase, which is read-only")
        if self.is_owner(session) or self.started_by(session, run_id):
            return
        raise SpaceError(
            f"{action}: run {run_id} was not started in this session; only the owner (logged in) can {action} it"
        )

    def check_owner(self, session: str | None, action: str) -> None:
        if not self.is_owner(session):
            raise SpaceError(f"{action}: only the owner (logged in) can do this")

    # ------------------------------------------------------------------ queue
    def check_queue(self, session: str | None, waiting: Sequence[Mapping[str, Any]], new_runs: int) -> None:
        """Raise SpaceError if ``new_runs`` more runs would pass this visitor's or the Space's queue limit.
        ``waiting`` are the runs now queued or training."""
        if self.is_owner(session):
            return
        mine = sum(1 for run in waiting if self.started_by(session, run["id"]))
        if mine + new_runs > self.limits.per_visitor:
            raise SpaceError(
                f"queue: you have {mine} run(s) waiting or training and this Space allows {self.limits.per_visitor}"
                " per visitor; wait for one to finish or cancel it"
            )
        if len(waiting) + new_runs > self.limits.total:
            raise SpaceError(
                f"queue: this Space's queue is full ({len(waiting)} run(s) waiting or training, at most "
                f"{self.limits.total}); try again when one finishes"
            )

    # ------------------------------------------------------------------ disk
    def prune(self, store: RunStore, force: bool = False) -> list[int]:
        """Delete the oldest finished visitor runs (rows and folders) while the visitor runs are more than
        ``max_visitor_runs`` or weigh more than ``max_visitor_bytes``, or the runs folder is larger than
        ``max_runs_bytes``; at most every ``prune_every_s`` seconds unless ``force``. Never the owner's runs,
        the showcase (read-only) or an active run. Returns the ids."""
        if not self.space:
            return []
        with self._lock:
            now = time.time()
            if not force and now - self._last_prune < self.limits.prune_every_s:
                return []
            self._last_prune = now
            runs = {run["id"]: run for run in store.list_runs()}
            visitor = sorted(
                run_id
                for run_id, entry in self._runs.items()
                if not entry["owner"] and run_id in runs and run_id not in self.read_only
            )
            weight = {
                run_id: folder_size(Path(runs[run_id]["run_dir"])) if runs[run_id]["run_dir"] else 0
                for run_id in visitor
            }
            size, count, visitors_bytes = folder_size(self.root), len(visitor), sum(weight.values())

            def over() -> str | None:
                if count > self.limits.max_visitor_runs:
                    return f"{count} visitor runs, at most {self.limits.max_visitor_runs} kept"
                if visitors_bytes > self.limits.max_visitor_bytes:
                    return f"visitor runs over {self.limits.max_visitor_bytes / 1024**2:.0f} MB"
                if size > self.limits.max_runs_bytes:
                    return f"runs folder over {self.limits.max_runs_bytes / 1024**2:.0f} MB"
                return None

            pruned, why = [], over()
            reasons = []
            for run_id in visitor:  # oldest first
                if why is None:
                    break
                if runs[run_id]["status"] not in ("finished", "failed", "cancelled"):
                    continue
                try:
                    store.delete_run(run_id, delete_files=True)
                except StoreError:
                    continue
                reasons.append(why)
                size, count, visitors_bytes = (
                    size - weight[run_id],
                    count - 1,
                    visitors_bytes - weight[run_id],
                )
                pruned.append(run_id)
                self._runs.pop(run_id, None)
                why = over()
            if pruned:
                self._save()
                print(f"jagg app: pruned visitor runs {pruned} ({reasons[0]})", flush=True)
            return pruned

    def forget(self, run_id: int) -> None:
        with self._lock:
            if self._runs.pop(int(run_id), None) is not None:
                self._save()

    # ------------------------------------------------------------------ persistence
    def _load(self) -> dict[int, dict[str, Any]]:
        try:
            raw = json.loads(self._file.read_text(encoding="utf-8"))
            return {int(k): dict(v) for k, v in raw.items()}
        except (OSError, ValueError, AttributeError, TypeError, RecursionError):
            return {}

    def _save(self) -> None:
        tmp = self._file.with_suffix(".json.tmp")
        try:
            tmp.write_text(json.dumps({str(k): v for k, v in self._runs.items()}), encoding="utf-8")
            os.replace(tmp, self._file)
        except OSError as exc:  # a full or read-only disk loses only this bookkeeping
            print(f"jagg app: could not write {self._file.name}: {exc}", flush=True)


def _session_key(session: str | None) -> str:
    """A stored, non-reversible key of a session hash (the hash itself is the session's only secret)."""
    return hashlib.sha256((session or "").encode()).hexdigest()[:32]


# ---------------------------------------------------------------------------------------------- files


class FilePublisher:
    """Turns files of the runs folder into paths gradio may copy into its cache and serve.

    gradio copies a component's file into its cache (and its file route serves it from there) only when
    the file lies in the working directory, the temp directory or an allowed path. The runs folder is never
    an allowed path (the route would serve all of it), so a runs folder elsewhere (``/data`` on a Space)
    hands gradio a copy under a private temp folder instead. The copies are bounded: checked after every
    eighth of ``max_bytes`` copied, past ``max_bytes`` the oldest go (down to half of it); a temp folder the
    publisher made is removed when the app exits.
    """

    def __init__(
        self,
        runs_dir: str | os.PathLike[str],
        public_dir: str | os.PathLike[str] | None = None,
        max_bytes: int = PUBLIC_MAX_BYTES,
    ):
        self.root = Path(runs_dir).resolve()
        bases = (Path.cwd().resolve(), Path(tempfile.gettempdir()).resolve())
        self.direct = any(self.root.is_relative_to(base) for base in bases)
        self._public = Path(public_dir) if public_dir else None
        self.max_bytes = max_bytes
        self._written = 0  # bytes copied since the last check
        self._lock = threading.Lock()

    def __call__(self, path: str | os.PathLike[str]) -> str:
        if self.direct:
            return str(path)
        src = Path(path)
        stat = src.stat()
        key = hashlib.sha256(f"{src.resolve()}:{stat.st_mtime_ns}:{stat.st_size}".encode()).hexdigest()[:24]
        with self._lock:
            if self._public is None:
                self._public = Path(tempfile.mkdtemp(prefix="jagg-public-"))
                atexit.register(shutil.rmtree, self._public, ignore_errors=True)
            dst = self._public / key / src.name
            if not dst.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                tmp = dst.with_name(dst.name + ".tmp")
                shutil.copyfile(src, tmp)
                os.replace(tmp, dst)
                self._written += stat.st_size
                if self._written > self.max_bytes // 8:
                    self.prune(keep=dst)
        return str(dst)

    def prune(self, keep: Path | None = None) -> list[Path]:
        """While the copies weigh more than ``max_bytes``, delete the oldest (never ``keep``) until they weigh
        at most half of it. Returns the deleted copies."""
        if self._public is None or not self._public.is_dir():
            return []
        files = []
        for path in self._public.glob("*/*"):
            try:
                stat = path.stat()
            except FileNotFoundError:
                continue
            files.append((stat.st_mtime_ns, stat.st_size, path))
        total = sum(size for _, size, _ in files)
        self._written = 0
        deleted: list[Path] = []
        if total <= self.max_bytes:
            return deleted
        for _, size, path in sorted(files, key=lambda f: f[:2]):
            if total <= self.max_bytes // 2:
                break
            if path == keep:
                continue
            path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                path.parent.rmdir()
            total -= size
            deleted.append(path)
        return deleted

    def items(self, items: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """Gallery items (path, caption) with publishable paths."""
        return [(self(path), caption) for path, caption in items]


def exports_root() -> Path:
    """The folder of every visitor's reports and exports: inside gradio's cache (``GRADIO_TEMP_DIR``, else
    ``<temp>/gradio``), where gradio serves a file it is handed without copying it again."""
    from gradio.utils import get_upload_folder

    return Path(get_upload_folder()) / "jagg-exports"


def session_export_dir(session: str | None) -> Path:
    """A visitor's own export folder under :func:`exports_root` (named by a hash: the session hash comes
    from the client and is never used as a path)."""
    return exports_root() / _session_key(session)


def prune_exports(
    root: Path,
    keep: Iterable[str | os.PathLike[str]] = (),
    per_session: int | None = None,
    max_bytes: int | None = None,
) -> list[Path]:
    """Delete the oldest reports and exports under ``root`` (one folder per session): beyond the newest
    ``per_session`` (default EXPORTS_PER_SESSION) files of a session, then, oldest first, while the whole
    folder is over ``max_bytes`` (default EXPORTS_MAX_BYTES). The files in ``keep`` (just written) stay.
    Returns the deleted paths."""
    per_session = EXPORTS_PER_SESSION if per_session is None else per_session
    max_bytes = EXPORTS_MAX_BYTES if max_bytes is None else max_bytes
    kept = {Path(p).resolve() for p in keep}
    files: list[tuple[float, int, Path]] = []
    deleted: list[Path] = []
    for folder in (p for p in _entries(root) if p.is_dir()):
        mine = sorted((stat for stat in map(_stat, _entries(folder)) if stat is not None), reverse=True)
        for _, _, path in mine[per_session:]:
            if path.resolve() not in kept and _unlink(path):
                deleted.append(path)
        files += [entry for entry in mine[:per_session]]
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files):
        if total <= max_bytes:
            break
        if path.resolve() not in kept and _unlink(path):
            deleted.append(path)
            total -= size
    return deleted


def _entries(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:
        return []


def _stat(path: Path) -> tuple[float, int, Path] | None:
    """(mtime, size, path) of a regular file; None for anything else or a file gone meanwhile."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime, st.st_size, path) if path.is_file() else None


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except OSError:
        return False
