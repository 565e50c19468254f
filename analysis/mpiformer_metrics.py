"""Reading an mpiformer run: RUNDIR/metrics.h5 and its checkpoints, and
any HDF5 file the project writes (h5_file, read_h5), so that a damaged
file is one line naming it and no read waits for long.

metrics.h5 is written in HDF5 SWMR mode, so it can be read while the run
trains; columns grow one at a time, so a row caught half-written is left
out (every column is cut to the shortest).

Opening: a file is opened as a plain reader, which never retries. Only a
file HDF5 marks as open for writing (a run writing its metrics.h5, or one
killed while it did; a plain open is refused then) is opened as an SWMR
reader, with HDF5's checksum retries bounded (SWMR_READ_ATTEMPTS): its
default of 100, with a sleep that doubles each time, never ends on a
damaged file. h5py has no setter for them, so the bound is set through
ctypes on the HDF5 library h5py itself runs on. A plain open that fails on
a file whose superblock says a writer has it open is a torn read beside
that writer, tried again as any fault of a file being written (read_h5).

Files come from elsewhere too (a checkpoint shared for export, shards
downloaded), so h5_file refuses, before anything is read, what mpiformer
never writes and a reader must not follow: links other than hard ones
(an external link opens another file), virtual datasets and external
storage (data in other files), filters other than Fletcher32, deflate and
shuffle (code a file asks HDF5 to load), groups that loop back or nest
beyond MAX_GROUP_DEPTH, and datasets or attributes that declare more
bytes than the file can hold (a read would allocate them). Text from a
file reaches the terminal only through terminal_safe.
"""

import contextlib
import ctypes
import os
import re
import sys
import time

import h5py
import numpy as np
from h5py import h5a, h5d, h5g, h5l, h5o, h5z

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpiformer_checksum import crc32c  # noqa: E402

METRICS_FORMAT = "mpiformer-metrics"
CHECKPOINT_FORMAT = "mpiformer-checkpoint"

# What h5py raises for a file it cannot read: OSError from most calls,
# KeyError when an object will not open, RuntimeError when attributes will
# not list.
H5_FAULTS = (OSError, KeyError, RuntimeError)
# What reading raises where a file holds what the reader did not expect (a
# string where numbers belong, a scalar where a column does): a fault of
# the file as well, inside h5_file.
SHAPE_FAULTS = (TypeError, ValueError, IndexError)
# h5py's words for an object or attribute a file lacks.
MISSING = ("doesn't exist", "can't locate attribute", "component not found")
# Filters a reader runs: Fletcher32, which mpiformer writes, and deflate and
# shuffle, which h5py writes; any other is a plugin a file asks HDF5 to load.
READABLE_FILTERS = (h5z.FILTER_FLETCHER32, h5z.FILTER_DEFLATE, h5z.FILTER_SHUFFLE)
# Deflate's largest ratio (a run of one byte): the most a deflated dataset
# can unpack to, per byte it stores.
DEFLATE_MAX_RATIO = 1032
# mpiformer nests two groups deep (/optimizer/m); a walk stops far beyond.
MAX_GROUP_DEPTH = 64
OUTSIDE = "refusing a file that reaches outside itself"
# A refused object's name is shown whole up to twice this, else its ends.
SHOWN_NAME_ENDS = 60
# An HDF5 superblock: its signature, and the consistency flags a writer sets
# (superblock versions 2 and 3, those of SWMR files): write, SWMR write.
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
SUPERBLOCK_WRITER_FLAGS = 0x01 | 0x04
# Attempts at a checksummed metadata read beside an SWMR writer. HDF5 sleeps
# 1 ns, 2 ns, 4 ns, ... between them: 2^N ns in all, about 0.27 s for 28,
# time enough for the writer to finish a write the reader caught half done.
SWMR_READ_ATTEMPTS = 28
# How long read_metrics tries again a file being written that fails to read,
# and the pause between tries.
FOLLOW_PATIENCE_S = 3.0
FOLLOW_PAUSE_S = 0.25


class RunError(Exception):
    """A run directory or file that cannot be read: one line for the user."""


class _WhileWritten(RunError):
    """A fault of a file HDF5 marks as open for writing: perhaps what its
    writer had half written, worth another try (read_h5)."""


class NotAsWritten(ValueError):
    """An object of an open file that is not as mpiformer writes it, in
    words without the file's path (h5_file puts it first)."""


def _text(value):
    # Bytes that are not UTF-8 stay visible as \xNN rather than failing.
    return value.decode(errors="backslashreplace") if isinstance(value, bytes) else str(value)


def terminal_safe(text, keep_newlines=False):
    """TEXT with every character a terminal would act on (ESC, the other
    control characters, bidirectional overrides) written as its Python
    escape (\\x1b), so that text from a file cannot recolour, retitle or
    rewrite the terminal; with keep_newlines line breaks stay (text shown
    as lines), else they become \\n (a one-line message stays one line)."""
    return "".join(c if c.isprintable() or (keep_newlines and c == "\n") else repr(c)[1:-1]
                   for c in str(text))


def report_fault(tool, message, exit_code=2):
    """Prints "TOOL: MESSAGE" on stderr as one terminal-safe line; returns
    exit_code, the tool's exit code."""
    print(f"{tool}: {terminal_safe(message)}", file=sys.stderr)
    return exit_code


def _h5py_message(e):
    """What h5py says of a fault, on one line; of a failed system call
    (h5py spells out time, descriptor, ...) only the system's message."""
    text = e.args[0] if e.args and isinstance(e.args[0], str) else str(e)
    called = re.search(r"error message = '([^']*)'", text)
    return called.group(1) if called else " ".join(text.split())


def _open_fault(e):
    """Why a plain open failed, in the words the C++ readers use."""
    message = " ".join(str(e.args[0] if e.args else e).split())
    inner = re.search(r"\((.*)\)$", message)
    why = inner.group(1) if inner else message
    truncated = re.search(r"truncated file: eof = (\d+), .*stored_eof = (\d+)", why)
    if truncated:
        return (f"truncated or corrupt (the file holds {truncated.group(1)} bytes but its HDF5 "
                f"superblock says {truncated.group(2)})")
    if "signature not found" in why:
        return f"not a readable HDF5 file ({why})"
    if "unable to lock file" in why:
        return f"locked by a program writing it ({_h5py_message(e)})"
    if getattr(e, "errno", None):
        return f"cannot open for reading ({os.strerror(e.errno)})"
    return f"truncated or corrupt (HDF5 could not open the file: {why})"


def _marked_as_written(path):
    """Whether PATH's superblock (version 2 or 3, at the start: mpiformer
    writes no user block) has a writer's consistency flags set, read from
    the bytes where HDF5 would not open the file."""
    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError:
        return False
    return (len(head) == 12 and head[:8] == HDF5_SIGNATURE and head[8] in (2, 3)
            and bool(head[11] & SUPERBLOCK_WRITER_FLAGS))


def _bounded_swmr_fapl():
    """A file access property list with SWMR_READ_ATTEMPTS, set through
    H5Pset_metadata_read_attempts of the HDF5 library h5py runs on (dlsym
    on h5py's own module finds it among the libraries it links); None where
    it cannot be set."""
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    try:
        setter = ctypes.CDLL(h5py.h5p.__file__).H5Pset_metadata_read_attempts
    except (OSError, AttributeError):
        return None
    setter.argtypes = (ctypes.c_int64, ctypes.c_uint)  # (hid_t, unsigned)
    setter.restype = ctypes.c_int
    return fapl if setter(fapl.id, SWMR_READ_ATTEMPTS) >= 0 else None


def open_h5(path, noun="HDF5 file"):
    """(h5py.File of PATH open for reading, whether HDF5 marks it as open
    for writing). Faults are RunError "PATH: what is wrong"; those of a file
    being written are _WhileWritten. See the module's note on opening."""
    if not os.path.exists(path):
        raise RunError(f"{path}: no such file")
    if os.path.isdir(path):
        raise RunError(f"{path}: is a directory, not a {noun}")
    if not os.path.isfile(path):  # a pipe would block the reader
        raise RunError(f"{path}: not a regular file")
    try:
        return h5py.File(path, "r"), False
    except OSError as e:
        plain = e
    if "already open for write" not in str(plain):
        # A writer holding the file's lock is finishing it, and a file whose
        # superblock names a writer was caught half written: worth another try.
        being_written = "unable to lock file" in str(plain) or _marked_as_written(path)
        raise (_WhileWritten if being_written else RunError)(f"{path}: {_open_fault(plain)}")
    fapl = _bounded_swmr_fapl()
    if fapl is None:
        raise RunError(f"{path}: is open for writing, and the HDF5 library of this h5py cannot "
                       "bound the retries of reading it beside its writer")
    try:
        fid = h5py.h5f.open(os.fsencode(path), h5py.h5f.ACC_RDONLY | h5py.h5f.ACC_SWMR_READ,
                            fapl=fapl)
    except OSError as e:
        raise _WhileWritten(f"{path}: {_open_fault(e)}") from None
    return h5py.File(fid), True


class _StorageCheck:
    """Refuses (RunError "PATH: OBJECT is ...") what mpiformer never writes
    and a reader must not follow or allocate: see the module's note. Each
    object is reached once: a second link to one (a group holding itself)
    is refused, so no walk loops."""

    def __init__(self, path):
        self.path, self.size, self.reached = path, os.path.getsize(path), {}
        self.stored = 0  # bytes declared so far by what is stored as it reads

    def refuse(self, name, what):
        if len(name) > 2 * SHOWN_NAME_ENDS:  # a path 64 groups deep, a name of 64 KiB
            name = f"{name[:SHOWN_NAME_ENDS]}...{name[-SHOWN_NAME_ENDS:]}"
        raise RunError(f"{self.path}: {name} is {what}")

    def group(self, gid, name, depth=0):
        if depth > MAX_GROUP_DEPTH:
            self.refuse(name, f"nested more than {MAX_GROUP_DEPTH} groups deep; refusing it")
        self.reached.setdefault(h5o.get_info(gid).addr, name)
        self.attributes(gid, name)
        links = []
        gid.links.iterate(links.append)
        for link in links:
            child = name.rstrip("/") + "/" + _text(link)
            self.hard_link(gid, link, child)
            obj = h5o.open(gid, link)  # a hard link: opens nothing outside
            address = h5o.get_info(obj).addr
            if address in self.reached:
                self.refuse(child, f"a second link to {self.reached[address]}; refusing a file "
                            "whose groups loop back or share an object")
            self.reached[address] = child
            if isinstance(obj, h5g.GroupID):
                self.group(obj, child, depth + 1)
            elif isinstance(obj, h5d.DatasetID):
                self.dataset(obj, child)

    def hard_link(self, gid, link, name):
        kind = gid.links.get_info(link).type
        if kind == h5l.TYPE_EXTERNAL:
            self.refuse(name, "an external link; " + OUTSIDE)
        if kind == h5l.TYPE_SOFT:
            self.refuse(name, "a soft link, which mpiformer never writes; refusing it")
        if kind != h5l.TYPE_HARD:
            self.refuse(name, f"a user-defined link (type {kind}); " + OUTSIDE)

    def dataset(self, did, name):
        self.attributes(did, name)
        dcpl = did.get_create_plist()
        layout = dcpl.get_layout()
        if layout == h5d.VIRTUAL:
            self.refuse(name, "a virtual dataset (its data lies in other files); " + OUTSIDE)
        if layout not in (h5d.COMPACT, h5d.CONTIGUOUS, h5d.CHUNKED):
            self.refuse(name, f"a dataset of storage layout {layout}; refusing it")
        if dcpl.get_external_count() > 0:
            self.refuse(name, "a dataset stored in external files; " + OUTSIDE)
        filters = [dcpl.get_filter(i)[0] for i in range(dcpl.get_nfilters())]
        for code in filters:
            if code not in READABLE_FILTERS:
                self.refuse(name, f"filtered by HDF5 filter {code}, which mpiformer never "
                            "writes (it writes Fletcher32; deflate and shuffle are read too); "
                            "refusing it")
        size = _declared_bytes(did)
        if h5z.FILTER_DEFLATE in filters:
            stored = did.get_storage_size()
            if size > stored * DEFLATE_MAX_RATIO:
                self.refuse(name, f"declared as {size} bytes, more than its {stored} deflated "
                            "bytes can hold; refusing it")
        else:
            self.declared(name, size)

    def attributes(self, oid, name):
        for i in range(h5a.get_num_attrs(oid)):
            attr = h5a.open(oid, index=i)
            self.declared(f"attribute '{_text(attr.name)}' of {name}", _declared_bytes(attr))

    def declared(self, name, size):
        """Refuses data stored as it reads (no deflate) that the file cannot
        hold beside what was declared before it: each value is stored once,
        and data never written would read as fill values."""
        self.stored += size
        if size > self.size:
            self.refuse(name, f"declared as {size} bytes, more than the file's {self.size} bytes "
                        "can hold; refusing it")
        if self.stored > self.size:
            self.refuse(name, f"declared as {size} bytes, more than the file's {self.size} bytes "
                        f"can hold beside the {self.stored - size} bytes declared before it; "
                        "refusing it")


def _declared_bytes(obj):
    """The bytes a dataset's or an attribute's values take in memory."""
    return obj.get_space().get_simple_extent_npoints() * obj.get_type().get_size()


def _read_fault(e):
    """What an exception raised while reading a file says of it."""
    message = _h5py_message(e)
    if isinstance(e, NotAsWritten):
        return message
    if isinstance(e, SHAPE_FAULTS) or (isinstance(e, KeyError) and
                                       any(m in message for m in MISSING)):
        return f"not as mpiformer writes it ({message})"
    return f"truncated or corrupt ({message})"


@contextlib.contextmanager
def h5_file(path, noun="HDF5 file"):
    """PATH open for reading (open_h5) for the with-block, after refusing
    what a reader must not follow (_StorageCheck). What h5py raises inside
    it becomes RunError "PATH: truncated or corrupt (...)", one line, and
    what a file of unexpected content makes reading raise (SHAPE_FAULTS,
    NotAsWritten) "PATH: ..." too. Keep the block to reading the file: a
    KeyError of other code would read as a fault of the file."""
    f, written = open_h5(path, noun)
    fault = _WhileWritten if written else RunError
    try:
        with f:
            _StorageCheck(path).group(f["/"].id, "/")
            yield f
    except H5_FAULTS + SHAPE_FAULTS as e:
        # Content not as written is no torn read: reported at once.
        fault = RunError if isinstance(e, NotAsWritten) else fault
        raise fault(f"{path}: {_read_fault(e)}") from None


def read_h5(path, read, noun="HDF5 file", patience=0.0):
    """read(f) of PATH in h5_file. A fault of a file being written is tried
    again every FOLLOW_PAUSE_S for up to `patience` seconds, then reported
    with how long it was tried; any other fault at once."""
    start, tries = time.monotonic(), 0
    while True:
        tries += 1
        try:
            with h5_file(path, noun) as f:
                return read(f)
        except _WhileWritten as e:
            waited = time.monotonic() - start
            if waited + FOLLOW_PAUSE_S > patience:
                if tries == 1:
                    raise RunError(str(e)) from None
                raise RunError(f"{e}; gave up after {tries} tries in {waited:.1f} s (the file "
                               "is marked as being written)") from None
        time.sleep(FOLLOW_PAUSE_S)


def read_config(ini):
    """The `name = value` lines of a run's config (config.ini, or the config
    attribute of metrics.h5 and of a checkpoint) as a dict of strings."""
    cfg = {}
    for line in _text(ini).splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = (part.strip() for part in line.split("=", 1))
            cfg[key] = value
    return cfg


def metrics_path(rundir):
    return rundir if rundir.endswith(".h5") else os.path.join(rundir, "metrics.h5")


def file_format(f):
    """The root attribute `format` of an open file, "" when it has none
    (attrs.get would take a damaged file's fault for a missing attribute)."""
    return _text(f.attrs["format"]).rstrip(" ") if "format" in f.attrs else ""


def numbers(dataset, ndims=(1,)):
    """The values of a dataset that must hold integers or floats in one of
    `ndims` dimensions (None: any); NotAsWritten naming it otherwise (a
    string where numbers belong, a group where a dataset does)."""
    if not isinstance(dataset, h5py.Dataset):
        raise NotAsWritten(f"{dataset.name} is not a dataset")
    dtype = dataset.dtype
    if not (np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.floating)):
        held = "strings" if dtype.kind in "OSU" else dtype
        raise NotAsWritten(f"{dataset.name} holds {held}, not numbers")
    if ndims is not None and dataset.ndim not in ndims:
        raise NotAsWritten(f"{dataset.name} has {dataset.ndim} dimensions, not "
                           + " or ".join(map(str, ndims)))
    values = dataset[()]
    _check_sum(dataset, values)
    return values


def _check_sum(dataset, values):
    """The values read against the dataset's attribute crc32c, the CRC-32C
    of its values as stored (data/FORMAT.md); NotAsWritten when they differ,
    or when the dataset has none though its file's attribute checksum
    promises one on every dataset."""
    if "crc32c" not in dataset.attrs:
        if "checksum" in dataset.file.attrs:
            promise = _text(dataset.file.attrs["checksum"])
            if promise != "crc32c":
                raise NotAsWritten(f"attribute 'checksum' is '{terminal_safe(promise)}'; "
                                   "this reader checks 'crc32c'")
            raise NotAsWritten(f"{dataset.name} has no 'crc32c' attribute, which its file's "
                               "'checksum' attribute promises on every dataset")
        return
    stored = np.asarray(dataset.attrs["crc32c"])
    if stored.ndim != 0 or not np.issubdtype(stored.dtype, np.integer) \
            or not 0 <= int(stored) <= 0xFFFFFFFF:
        raise NotAsWritten(f"attribute 'crc32c' of {dataset.name} is not one 32-bit checksum")
    computed = crc32c(np.asarray(values, dtype=dataset.dtype))
    if int(stored) != computed:
        raise NotAsWritten(f"{dataset.name} is damaged: its CRC-32C checksum is "
                           f"0x{int(stored):08x} but its values sum to 0x{computed:08x}")


def group_of(f, name):
    """Group `name` of an open file; NotAsWritten when it is missing or
    something else."""
    if not isinstance(f.get(name), h5py.Group):
        raise NotAsWritten(f"no /{name} group")
    return f[name]


def int_attr(obj, name):
    """Attribute `name` of an open group or dataset as an int; NotAsWritten
    naming it when it is missing or not one integer."""
    where = "the root group" if obj.name == "/" else obj.name
    if name not in obj.attrs:
        raise NotAsWritten(f"{where} has no attribute '{name}'")
    value = np.asarray(obj.attrs[name])
    if value.ndim != 0 or not np.issubdtype(value.dtype, np.integer):
        raise NotAsWritten(f"attribute '{name}' of {where} is not one integer")
    return int(value)


def _attributes(f):
    return {k: (_text(v) if isinstance(v, (bytes, str)) else v) for k, v in f.attrs.items()}


def _columns(group):
    data = {}
    for name in group.keys():
        dataset = group[name]
        if group.file.swmr_mode and isinstance(dataset, h5py.Dataset):
            dataset.refresh()  # see what the writer has flushed since opening
        data[name] = numbers(dataset)
    n = min((len(v) for v in data.values()), default=0)
    return {name: np.asarray(v[:n]) for name, v in data.items()}


def read_metrics(rundir, patience=FOLLOW_PATIENCE_S):
    """{'attrs': {...}, 'train': {column: array}, 'eval': {column: array}}.
    Also while the run writes the file: a read that fails then is tried
    again for up to `patience` seconds (read_h5)."""
    path = metrics_path(rundir)
    if not os.path.lexists(path):
        raise RunError(f"{path}: no such file (is {rundir} a run directory?)")

    def read(f):
        if file_format(f) != METRICS_FORMAT:
            raise RunError(f"{path}: not an mpiformer metrics file")
        groups = {name: group_of(f, name) for name in ("train", "eval")}
        return {"attrs": _attributes(f), "train": _columns(groups["train"]),
                "eval": _columns(groups["eval"])}

    return read_h5(path, read, "metrics file", patience)


def checkpoints(rundir):
    """Checkpoint files of a run, oldest first."""
    directory = os.path.join(rundir, "checkpoints")
    if not os.path.isdir(directory):
        return []
    names = sorted(n for n in os.listdir(directory) if n.startswith("step_") and n.endswith(".h5"))
    return [os.path.join(directory, n) for n in names]


def read_checkpoint(path, group="params"):
    """({tensor name: float32 array}, root attributes) of a checkpoint."""
    with h5_file(path, "checkpoint") as f:
        if file_format(f) != CHECKPOINT_FORMAT:
            raise RunError(f"{path}: not an mpiformer checkpoint")
        stored = group_of(f, group)
        attrs = _attributes(f)
        tensors = {name: numbers(stored[name], None) for name in sorted(stored.keys())}
    return tensors, attrs


def layer_of(name):
    """The layer a tensor belongs to: 'decoder.layers.1.mlp.fc.weight' -> 'decoder.layers.1'."""
    parts = name.split(".")
    if "layers" in parts:
        i = parts.index("layers")
        return ".".join(parts[: i + 2])
    return parts[0]


def smooth(values, window):
    """Trailing moving average over `window` rows (1: unchanged). Non-finite
    values (NaN: not written; inf: a diverged step) are left out of the
    averages; a window without any finite value gives NaN."""
    values = np.asarray(values, dtype=float)
    if window <= 1 or len(values) == 0:
        return values
    finite = np.isfinite(values)
    kernel = np.ones(min(window, len(values)))
    sums = np.convolve(np.where(finite, values, 0.0), kernel)[: len(values)]
    counts = np.convolve(finite.astype(float), kernel)[: len(values)]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def has_values(group, column):
    """Whether a column is in the file and holds a finite value (a column
    the run's version did not write, or carried as NaN, does not)."""
    values = group.get(column)
    return values is not None and len(values) > 0 and bool(np.isfinite(values).any())


# What plot_runs can put on the x axis: step, cumulative target tokens of
# training (the sum of /train/tokens), or wall time since the run began
# (/train/elapsed_s, over every resume).
X_AXES = ("step", "tokens", "time")


def x_values(metrics, x="step"):
    """(train x, eval x) of one run for X_AXES' `x`. Eval rows take their
    own elapsed_s when written, else the train rows' value at their step
    (interpolated). Raises RunError when a run lacks what `x` needs."""
    if x not in X_AXES:
        raise ValueError(f"x must be one of {', '.join(X_AXES)}, not {x!r}")
    train, evaluation = metrics["train"], metrics["eval"]
    train_step = np.asarray(train.get("step", []), dtype=float)
    eval_step = np.asarray(evaluation.get("step", []), dtype=float)
    if x == "step" or len(train_step) == 0:  # a run that has logged nothing yet
        return train_step, eval_step
    if x == "tokens":
        if "tokens" not in train:
            raise RunError("no /train/tokens column: cannot plot against tokens")
        seen = np.cumsum(np.asarray(train["tokens"], dtype=float))
        return seen, _at_steps(eval_step, train_step, seen)
    if not has_values(train, "elapsed_s"):
        raise RunError("no /train/elapsed_s column (metrics written before mpiformer "
                       "recorded wall time): plot against --x step or --x tokens")
    elapsed = np.asarray(train["elapsed_s"], dtype=float)
    if has_values(evaluation, "elapsed_s"):
        return elapsed, np.asarray(evaluation["elapsed_s"], dtype=float)
    return elapsed, _at_steps(eval_step, train_step, elapsed)


def _at_steps(steps, known_steps, known_values):
    """known_values (one per known step, rising) interpolated at `steps`,
    from 0 at step 0; NaN outside what is known."""
    ok = np.isfinite(known_values)
    xs = np.concatenate([[0.0], np.asarray(known_steps, dtype=float)[ok]])
    ys = np.concatenate([[0.0], np.asarray(known_values, dtype=float)[ok]])
    return np.interp(steps, xs, ys, right=np.nan) if len(steps) else np.array([])


def _time_unit(seconds):
    """(divisor, name) that keeps the largest of `seconds` readable."""
    largest = max((float(np.nanmax(s)) for s in seconds if np.isfinite(s).any()), default=0.0)
    if largest >= 3 * 3600:
        return 3600.0, "h"
    if largest >= 3 * 60:
        return 60.0, "min"
    return 1.0, "s"


# The panels plot_runs draws, in order: six with a grid of six axes or
# more, the first four of the earlier layout with four.
PANELS = ("loss", "perplexity", "lr", "grad_norm", "tokens_per_s", "padding_efficiency")
PANELS_OF_FOUR = ("loss", "lr", "tokens_per_s", "padding_efficiency")
_TITLES = {"loss": "loss", "perplexity": "eval perplexity", "lr": "learning rate",
           "grad_norm": "gradient norm (before clipping)", "tokens_per_s": "tokens/s",
           "padding_efficiency": "padding efficiency"}


def plot_runs(runs, axes, window=1, x="step", log_loss=False):
    """Draws runs {label: read_metrics(...)} overlaid, one colour per run, on
    a grid of axes: with six (2x3) the PANELS, with four (2x2) loss,
    learning rate, tokens/s and padding efficiency.

    loss: the training objective (label-smoothed when --label-smoothing > 0)
    and, where written and different, the true NLL (dotted); eval loss
    (circles) and eval NLL (open squares), both dashed. perplexity: eval
    perplexity. With window > 1 the train loss, NLL, gradient norm and
    tokens/s are drawn faint as logged and their trailing moving average
    over `window` rows over them. x: one of X_AXES (raises RunError for a
    run that lacks its column, before drawing). log_loss: log-scale loss and
    perplexity axes. Padding efficiency keeps a fixed y range, 0.9 (lower
    if a point is) to 1. A panel without a point says "no data: ..." why
    (a run read before its first row or its first evaluation)."""
    flat = list(np.ravel(axes))
    panels = PANELS if len(flat) >= len(PANELS) else PANELS_OF_FOUR
    ax_of = dict(zip(panels, flat))
    xs = {label: x_values(m, x) for label, m in runs.items()}  # may raise before drawing
    scale, xlabel = 1.0, "step"
    if x == "tokens":
        xlabel = "target tokens seen"
    elif x == "time":
        scale, unit = _time_unit([v[0] for v in xs.values()] + [v[1] for v in xs.values()])
        xlabel = f"elapsed ({unit})"

    def curve(ax, xv, values, color, label, style="-"):
        values = np.asarray(values, dtype=float)
        if window > 1:
            ax.plot(xv, values, style, color=color, alpha=0.25, linewidth=0.8, label="_nolegend_")
            values = smooth(values, window)
        ax.plot(xv, values, style, color=color, linewidth=1.5, label=label)

    for i, (label, m) in enumerate(runs.items()):
        color = f"C{i % 10}"
        train, evaluation = m["train"], m["eval"]
        train_x, eval_x = xs[label]
        train_x, eval_x = train_x / scale, eval_x / scale
        has_eval = len(evaluation.get("step", [])) > 0
        ax = ax_of["loss"]
        # Without label smoothing the NLL is the loss: one curve says both.
        train_nll = has_values(train, "nll") and not _same(train["nll"], train.get("loss"))
        eval_nll = (has_eval and has_values(evaluation, "nll")
                    and not _same(evaluation["nll"], evaluation.get("loss")))
        plain = has_values(train, "nll") and not train_nll
        curve(ax, train_x, train.get("loss", []), color,
              f"{label} train" + (" (loss = nll)" if plain else ""))
        if train_nll:
            curve(ax, train_x, train["nll"], color, f"{label} train nll", style=":")
        if has_eval:
            ax.plot(eval_x, evaluation["loss"], "o--", color=color, markersize=3,
                    label=f"{label} eval")
            if eval_nll:
                ax.plot(eval_x, evaluation["nll"], "s--", color=color, markersize=3,
                        markerfacecolor="none", label=f"{label} eval nll")
        if "perplexity" in ax_of and has_eval and "perplexity" in evaluation:
            ax_of["perplexity"].plot(eval_x, evaluation["perplexity"], "o-", color=color,
                                     markersize=3, label=label)
        ax_of["lr"].plot(train_x, train.get("lr", []), color=color, label=label)
        if "grad_norm" in ax_of:
            curve(ax_of["grad_norm"], train_x, train.get("grad_norm", []), color, label)
        curve(ax_of["tokens_per_s"], train_x, train.get("tokens_per_s", []), color, label)
        ax_of["padding_efficiency"].plot(train_x, train.get("padding_efficiency", []),
                                         color=color, label=label)
    for name, ax in ax_of.items():
        ax.set_title(_TITLES[name])
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
        if not _drawn(ax):
            # Blank axes read as a broken plot: say why there is nothing.
            ax.text(0.5, 0.5, "no data: " + _NO_DATA.get(name, "no rows logged yet"),
                    transform=ax.transAxes, ha="center", va="center", color="0.4", wrap=True)
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        if name == "padding_efficiency":
            _fraction_axis(ax)
        if log_loss and name in ("loss", "perplexity"):
            _log_axis(ax)
        ax.legend(fontsize="small")


# Why a panel can be empty: a run read before its first row (metrics.h5 is
# read while the run trains), or before its first evaluation.
_NO_DATA = {"loss": "no rows logged yet",
            "perplexity": "no evaluation yet\n(every --eval-every steps and at the end)"}


def _drawn(ax):
    """Whether an axis shows any finite point (a column without a value
    plots an empty or all-NaN line)."""
    return any(np.isfinite(np.asarray(line.get_ydata(), dtype=float)).any() for line in ax.lines)


def _fraction_axis(ax):
    """A fixed y range for a fraction that sits near 1 (padding efficiency:
    autoscaled, 0.993 to 0.999 would turn noise into a trend): from 0.9, or
    lower in steps of 0.1 to hold every point, up to 1."""
    low = min(float(np.nanmin(line.get_ydata())) for line in ax.lines
              if np.isfinite(np.asarray(line.get_ydata(), dtype=float)).any())
    bottom = min(0.9, np.floor(low * 10) / 10)
    ax.set_ylim(bottom, 1.0 + 0.02 * (1.0 - bottom))  # a curve at 1 clear of the frame


def _same(a, b):
    """Whether two columns hold the same values (NaN where the other has NaN)."""
    if b is None or len(a) != len(b):
        return False
    return bool(np.allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float),
                            rtol=1e-12, atol=0.0, equal_nan=True))


def _log_axis(ax):
    """A log-scale y axis labelled in plain numbers, minor ticks too when
    the range is within a decade or so (a loss curve's usual span)."""
    from matplotlib import ticker

    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ticker.LogFormatter(labelOnlyBase=False))
    ax.yaxis.set_minor_formatter(
        ticker.LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.5)))


def plot_figure(runs, window=1, x="step", log_loss=False):
    """A new 15 x 8 inch figure with plot_runs' six panels (2x3)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    try:
        plot_runs(runs, axes, window=window, x=x, log_loss=log_loss)
    except Exception:
        plt.close(fig)
        raise
    fig.tight_layout()
    return fig
