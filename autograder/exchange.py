"""nbgrader's `collect`, with the owner check enforced. The exchange's inbound folder is writable by
every user (mode 733): a student can create `bob+<assignment>+<later time>+x/` holding a blank notebook,
and nbgrader's own collect only logs "claims to be submitted by bob but is owned by mallory; cheating
attempt?" and copies it as Bob's newest submission (graded 0 / 17, "without problems").

Here a submission in a student's name whose folder another user owns (or that is not a folder at all:
a symbolic link to one of the student's own folders) is never collected when that student has a folder
of their own in the inbound: their newest own submission is collected instead (nbgrader's due-date rule
applied to their own), and the refusal is logged as an error naming the folder and its owner. A student
with no folder of their own (all servers write as one account, or the instructor put a file in by hand)
keeps nbgrader's behaviour and warning: owners say nothing there.

A submission's time is the one `nbgrader submit` wrote, in the student's own process, into the folder's
name and its `timestamp.txt`: a student can make a folder today named for last week. The kernel's record
of when the folder or a file in it last changed (their ctimes, which no user can set back) bounds it: a claimed time earlier
than that by more than `CLOCK_SLACK` is replaced, in the record collect decides with and in the collected
`timestamp.txt`, by the folder's own time, and the refusal is logged as an error naming both times.

Configured for the course's collect by `c.ExchangeFactory.collect` (the checkout's nbgrader_config.py,
the JupyterHub's deploy/jupyterhub/jupyter/nbgrader_config.py).

`ListWithoutExchangeSaidOnce` is nbgrader's `list` that says once per process, not at every page, that there
is no exchange: formgrader lists the exchange for each page it serves, and a class graded from an LMS's
zip has none (nbgrader logged "CRITICAL Unwritable directory, please contact your instructor" over and
over in the instructor's console, a student-facing line). Configured by `c.ExchangeFactory.list` in the
shared settings (autograder/nbgrader_config.py).
"""
from __future__ import annotations

import glob
import os
import stat
from datetime import datetime, timedelta, timezone

from nbgrader.exchange.abc.exchange import ExchangeError
from nbgrader.exchange.default.collect import ExchangeCollect
from nbgrader.exchange.default.list import ExchangeList
from nbgrader.utils import check_directory
from traitlets import Unicode

from .printable import printable

try:
    import pwd
except ImportError:  # pragma: no cover - Windows: no owners to check (nbgrader checks none there either)
    pwd = None


def owner_of(path: str) -> str | None:
    """The user name owning folder `path` ('uid N' when the system has no name for it); None when it is
    not a real folder (a symbolic link is its maker's, whatever it points at) or cannot be read."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(info.st_mode):
        return None
    try:
        return pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        return f"uid {info.st_uid}"


# How far a submission's claimed time may lie before the time its folder was last changed: a copy of a large
# notebook, and the clocks of the student's server and the exchange's file server, which may differ a little.
CLOCK_SLACK = timedelta(minutes=15)
BULK_WINDOW = timedelta(seconds=5)  # folders changed this close together, one after the other, were changed at once
TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f %Z"  # what `nbgrader submit` writes (its default timestamp_format)


MAX_DEPTH = 64  # folders inside folders in a submission: deeper ones are neither walked nor copied (named)
MAX_ENTRIES = 20_000  # files and folders looked at in one submission folder


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, AttributeError):
        return f"uid {uid}"


def changed_at(path: str) -> datetime | None:
    """When the kernel last changed what the folder's owner put in folder `path` (the latest ctime of their files
    and folders in it: set at each one made, written or moved, never set back by a user; a folder made before the
    due date, its notebook rewritten after it, is dated by the notebook); naive UTC as nbgrader's parsed timestamps;
    None when the folder cannot be read. Others' entries, and the folder's own time that they move, never date it:
    `nbgrader submit` leaves the folder writable by all, and a classmate who made and removed one file in it
    re-dated an on-time student late (red team 13). An empty folder is dated by its own time. Links are not followed
    (the copy takes none: a link to / had collect walk the whole disk), and the walk is a loop with limits (Python's
    os.walk recursed: a folder 1,100 deep stopped the whole collect). A folder of more entries than MAX_ENTRIES, which
    are not all looked at, is dated now: the rest may hold a notebook written after the due date (red team 14)."""
    try:
        top = os.lstat(path)
    except OSError:
        return None
    times, owner = [], top.st_uid
    pending, looked = [(path, 0)], 0
    while pending:
        if looked >= MAX_ENTRIES:  # not all of it looked at: what is left may be newer (a red team wrote its notebook
            return datetime.now(timezone.utc).replace(tzinfo=None)  # behind 20,000 empty files): dated now
        folder, depth = pending.pop()
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    looked += 1
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if info.st_uid != owner:
                        continue  # another user's: never collected, never the date of the owner's submission
                    times.append(info.st_ctime)
                    if stat.S_ISDIR(info.st_mode) and depth < MAX_DEPTH:
                        pending.append((entry.path, depth + 1))
        except OSError:
            continue
    return datetime.fromtimestamp(max(times or [top.st_ctime]), timezone.utc).replace(tzinfo=None)


_DIR_MODE, _FILE_MODE = 0o755, 0o644  # what collect writes: the collecting user's alone to change
_NO_FOLLOW = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)


def copy_own_files(src: str, dest: str, coursedir, log) -> None:
    """Copy submission folder `src` to `dest` (a new folder), taking only the regular files and folders in it:
    never what a symbolic link names (nbgrader's copytree followed them, as the collecting instructor: a
    student's link to a classmate's collected notebook, or to the instructor's files, came back as theirs),
    nor a FIFO, socket or device. Each is opened without following links (O_NOFOLLOW, relative to its opened
    folder), so a link swapped in during the copy is refused too. nbgrader's own limits hold, counted on what
    is copied (its size check skipped links): CourseDirectory.ignore / include globs, max_file_size, and
    max_dir_size for the whole (RuntimeError past it, as nbgrader's). What is copied is made writable by the
    collecting user alone (folders 0755, files 0644): `nbgrader submit` leaves its folders writable by all,
    and copytree kept that, so any student could rewrite a classmate's collected notebook or timestamp.txt.
    A file that cannot be read is left out and named."""
    import fnmatch
    import shutil

    budget = [1000 * coursedir.max_dir_size]
    dir_mode, file_mode = (0o2775, 0o664) if coursedir.groupshared else (_DIR_MODE, _FILE_MODE)  # nbgrader's g+rw

    def refuse(path: str, why: str) -> None:
        log.warning("%s: not collected (%s)", path, why)

    def fill_folder(top_fd: int, top_path: str, top_to: str) -> None:
        """The folder's own files and folders, depth first in a loop (no recursion: Python's stack ended a copy of
        a folder 1,100 deep), each opened relative to its opened parent without following links, at most
        MAX_DEPTH + 1 folders open at once; deeper than MAX_DEPTH or past MAX_ENTRIES, named and left out."""
        def listed(fd: int) -> list[str]:
            with os.scandir(fd) as entries:
                return sorted(entry.name for entry in entries)

        stack = [(top_fd, top_path, top_to, iter(listed(top_fd)))]  # (folder fd, its path, its copy, names left)
        looked = 0
        try:
            while stack:
                fd, path, to, names = stack[-1]
                name = next(names, None)
                if name is None:
                    stack.pop()
                    if fd != top_fd:
                        os.close(fd)
                    continue
                here = os.path.join(path, name)
                looked += 1
                if looked > MAX_ENTRIES:
                    refuse(here, f"past the first {MAX_ENTRIES:,} files and folders of this submission: the rest too")
                    return
                if any(fnmatch.fnmatch(name, glob) for glob in coursedir.ignore):
                    continue
                try:
                    info = os.lstat(name, dir_fd=fd)
                except OSError as err:
                    refuse(here, err.strerror)
                    continue
                if info.st_uid not in allowed:  # nbgrader submit leaves the folder writable by every user
                    refuse(here, f"made by {_user_name(info.st_uid)}, not by the student whose submission this is")
                    continue
                if stat.S_ISDIR(info.st_mode):
                    if len(stack) > MAX_DEPTH:
                        refuse(here, f"more than {MAX_DEPTH} folders deep")
                        continue
                    try:
                        inner = os.open(name, _NO_FOLLOW | os.O_DIRECTORY, dir_fd=fd)
                    except OSError as err:
                        refuse(here, err.strerror)
                        continue
                    try:
                        os.mkdir(os.path.join(to, name))
                        os.chmod(os.path.join(to, name), dir_mode)  # not the umask's: exactly this
                        stack.append((inner, here, os.path.join(to, name), iter(listed(inner))))
                    except BaseException:
                        os.close(inner)
                        raise
                elif not stat.S_ISREG(info.st_mode):
                    refuse(here, "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file")
                elif coursedir.include and not any(fnmatch.fnmatch(name, glob) for glob in coursedir.include):
                    continue
                elif coursedir.max_file_size and info.st_size > 1000 * coursedir.max_file_size:
                    refuse(here, f"{info.st_size} bytes, over CourseDirectory.max_file_size")
                else:
                    copy_file(fd, name, here, os.path.join(to, name))
        finally:
            for fd, *_ in stack:
                if fd != top_fd:
                    os.close(fd)

    def copy_file(fd: int, name: str, path: str, to: str) -> None:
        try:
            source = os.open(name, _NO_FOLLOW | getattr(os, "O_NONBLOCK", 0), dir_fd=fd)
        except OSError as err:
            refuse(path, err.strerror)
            return
        if not stat.S_ISREG(os.fstat(source).st_mode):  # swapped for a folder or a FIFO since it was looked at
            os.close(source)
            refuse(path, "not a regular file")
            return
        with os.fdopen(source, "rb") as reader:
            made = os.open(to, os.O_WRONLY | os.O_CREAT | os.O_EXCL, file_mode)
            try:
                os.fchmod(made, file_mode)
            except BaseException:
                os.close(made)
                raise
            with open(made, "wb") as writer:
                while chunk := reader.read(1 << 20):
                    budget[0] -= len(chunk)
                    if budget[0] < 0:
                        raise RuntimeError(f"Directory size is too big: over CourseDirectory.max_dir_size "
                                           f"({coursedir.max_dir_size} kB)")
                    writer.write(chunk)
            info = os.fstat(source)
        os.utime(to, ns=(info.st_atime_ns, info.st_mtime_ns))  # its time, as nbgrader's copy kept it; not its mode

    top = os.open(src, _NO_FOLLOW | os.O_DIRECTORY)
    allowed = {os.fstat(top).st_uid, os.geteuid(), 0}  # the folder's owner (the student), the user collecting, root
    try:
        os.mkdir(dest)  # a new folder: nothing that was there is removed below
    except BaseException:
        os.close(top)
        raise
    try:
        os.chmod(dest, dir_mode)
        fill_folder(top, src, dest)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)  # never half a submission where the grader reads one
        raise
    finally:
        os.close(top)


class _Without:
    """A logging filter: drops the records whose message starts with `start`."""

    def __init__(self, start: str):
        self.start = start

    def filter(self, record) -> bool:
        return not str(record.msg).startswith(self.start)


class _Printable:
    """A logging filter: a record's message with a student's control characters and undecodable bytes escaped (a
    folder name in the exchange is the student's choice: its escape sequences cleared the instructor's terminal and
    hid the very line that named it)."""

    def filter(self, record) -> bool:
        message = record.getMessage()
        shown = "\n".join(printable(line) for line in message.split("\n"))  # nbgrader's own lines stay lines
        if shown != message:
            record.msg, record.args = shown, ()
        return True


class _kept_if_failed:
    """A student's folder collected before (`dest`), copied aside while a newer submission replaces it: nbgrader
    removes it before copying, and a newer submission that could not be copied left none at all (the student then
    graded as missing). `restore()` puts it back; the copy aside is removed on the way out. Hidden (a leading '.'),
    beside it: the grader never reads it as a submission."""

    def __init__(self, dest: str):
        self.dest, self.aside = dest, None

    def __enter__(self) -> "_kept_if_failed":
        import shutil
        import tempfile

        if os.path.isdir(self.dest):
            self.aside = tempfile.mkdtemp(prefix=".collected-before-", dir=os.path.dirname(self.dest))
            shutil.copytree(self.dest, os.path.join(self.aside, "copy"), symlinks=True)
        return self

    def restore(self) -> bool:
        if self.aside is None or os.path.isdir(self.dest):
            return os.path.isdir(self.dest)
        os.replace(os.path.join(self.aside, "copy"), self.dest)
        return True

    def __exit__(self, *exc) -> None:
        import shutil

        if self.aside is not None:
            shutil.rmtree(self.aside, ignore_errors=True)


class OwnerCheckedCollect(ExchangeCollect):
    """nbgrader's ExchangeCollect; a submission whose folder another user owns is never collected as a
    student's who has folders of their own, and none is dated earlier than its folder was made."""

    inbound_changed_at = Unicode("", help=(
        "A moment (UTC, 'YYYY-MM-DD HH:MM:SS') at which you or an administrator changed the inbound's folders all at "
        "once (a chmod -R, chown, copy or restore): the submissions whose folders were last changed within 5 s of it "
        "keep the times their names claim, instead of being dated then. Collect names the moment when it sees many "
        "folders changed together; students cannot name it (they chose when theirs changed, and a crowd of their "
        "own folders kept a late submission's claimed time: red team 13).")).tag(config=True)

    def init_src(self):
        self._together = self._changed_together()
        return super().init_src()

    def _named_change(self) -> datetime | None:
        """`inbound_changed_at` as naive UTC, or None when not given; a moment that is none is refused, saying so."""
        text = self.inbound_changed_at.strip()
        if not text:
            return None
        try:
            when = datetime.fromisoformat(text.removesuffix("UTC").removesuffix("Z").strip())
        except ValueError:
            message = (f"nothing collected: OwnerCheckedCollect.inbound_changed_at={text!r} is no moment: give it as "
                       "'YYYY-MM-DD HH:MM:SS' in UTC, as collect printed it")
            self.log.error(message)  # nbgrader's app says only "nbgrader collect failed"
            raise ExchangeError(message) from None
        return when.astimezone(timezone.utc).replace(tzinfo=None) if when.tzinfo else when

    def _changed_together(self) -> set[str]:
        """The inbound folders whose claimed times are kept over their last change: those changed at the moment the
        instructor named (`inbound_changed_at`). Folders that claim a time more than CLOCK_SLACK before their last
        change, changed within BULK_WINDOW of each other, for at least 3 students, are said, with the moment to
        name if that was the instructor's own change (an administrator's chmod -R after the due date dated every
        on-time submission then: red team 12); they are never kept on their own say (red team 13: three colluding
        students, or one with folders owned by uids of hers that no account has, kept a late submission's time)."""
        inbound = os.path.join(self.root, self.coursedir.course_id, "inbound")
        early = []
        for path in glob.glob(os.path.join(inbound, f"*+{glob.escape(self.coursedir.assignment_id)}+*")):
            try:
                made, claimed = changed_at(path), ExchangeCollect._path_to_record(self, path)["timestamp"]
            except Exception:  # noqa: BLE001 - a name that is no time: dated as _path_to_record says
                continue
            if made is not None and claimed is not None and claimed < made - CLOCK_SLACK:
                early.append((made, owner_of(path), os.path.basename(path)))
        named = self._named_change()
        if named is not None:
            together = {name for made, _, name in early if abs(made - named) <= BULK_WINDOW}
            self.log.warning("%d submission(s) of %s changed at %s UTC, the moment you named "
                             "(OwnerCheckedCollect.inbound_changed_at), keep the times their names claim: %s.",
                             len(together), self.coursedir.assignment_id, named,
                             ", ".join(sorted(together)) or "none was changed then")
            return together
        early.sort()
        start = 0
        for end in range(1, len(early) + 1):
            if end == len(early) or early[end][0] - early[end - 1][0] > BULK_WINDOW:
                crowd = early[start:end]
                students = {owner for _, owner, _ in crowd if owner is not None}
                if len(students) >= 3:
                    moment = crowd[-1][0].strftime("%Y-%m-%d %H:%M:%S")
                    self.log.warning(
                        "%d submissions' folders (%d students) were all changed at about %s UTC, long after the times "
                        "their names claim, and are dated then. If you or an administrator changed the inbound then (a "
                        "chmod, chown, copy or restore), collect again with "
                        "--OwnerCheckedCollect.inbound_changed_at='%s' to keep the times their names claim (those "
                        "already collected are collected again); if nobody did, the students changed them.",
                        len(crowd), len(students), crowd[-1][0], moment)
                start = end
        return set()

    def _path_to_record(self, path):
        try:
            made = changed_at(path)
        except Exception:  # noqa: BLE001 - one student's folder never stops the whole collect
            made = None
        try:
            record = super()._path_to_record(path)
        except Exception:  # noqa: BLE001 - a name that is no time (anyone can write in the inbound): never the whole collect
            name = os.path.basename(path)
            self.log.error("%s: its name holds no submission time; dated by the file system instead (%s UTC).",
                           path, made)
            record = {"username": name.rsplit("+", 3)[0], "filename": name, "timestamp": made or datetime.min}
        if os.path.basename(path) in getattr(self, "_together", set()):
            pass  # changed at the moment the instructor named: the claimed time stands
        elif made is not None and record["timestamp"] is not None and record["timestamp"] < made - CLOCK_SLACK:
            self.log.error("%s claims to have been submitted at %s UTC, but it was last changed at %s UTC: dated "
                           "%s UTC (the time a student's own process writes is not taken over the file system's; a "
                           "chmod, chown, copy or restore of the inbound changes every folder's time too: if many "
                           "submissions say this at one time, that is what happened, so collect before such a change "
                           "and see the README's exchange section).", path, record["timestamp"], made, made)
            record["timestamp"] = made
        elif made is not None and record["timestamp"] is not None and record["timestamp"] > made + CLOCK_SLACK:
            # a claimed time later than anything in the folder (a folder named for 2099, made in a classmate's name
            # before they handed in, was "newer" than every real submission of theirs: never collected)
            self.log.error("%s claims to have been submitted at %s UTC, later than anything in it changed (%s UTC): "
                           "dated %s UTC.", path, record["timestamp"], made, made)
            record["timestamp"] = made
        self._dated = {**getattr(self, "_dated", {}), os.path.basename(path): record["timestamp"]}
        return record

    def do_copy(self, src, dest, log=None):
        """The student's own files and folders only (`copy_own_files`), then the time decided here written as
        the collected timestamp.txt, never the one the student's process wrote (it may say another time than
        the folder's name)."""
        copy_own_files(src, dest, self.coursedir, self.log)
        when = getattr(self, "_dated", {}).get(os.path.basename(src))
        if when is not None:
            stamp = os.path.join(dest, "timestamp.txt")
            if os.path.lexists(stamp):
                os.unlink(stamp)
            fd = os.open(stamp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, _FILE_MODE)
            with os.fdopen(fd, "w") as fh:
                fh.write(when.replace(tzinfo=timezone.utc).strftime(TIMESTAMP_FORMAT))

    def start(self):
        """nbgrader's collect, every line it logs made printable: a folder name in the inbound is a student's choice
        (the errors about a submission's time, logged while nbgrader reads the names, printed them raw)."""
        shown = _Printable()
        self.log.addFilter(shown)
        try:
            return super().start()
        finally:
            self.log.removeFilter(shown)

    def _exchange_is_ours(self) -> str:
        """'' when the exchange's folders cannot have been replaced by a student, else why they may have been: a
        root every user may rename entries in (777 without the sticky bit, as nbgrader makes it: a red team renamed
        the course's folder away and put its own inbound there, then hid, framed and re-dated classmates), or a
        course or inbound folder owned by another user than the one collecting (or root)."""
        info = os.stat(self.root)
        if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
            return (f"the exchange folder {self.root} lets every user rename what is in it (mode "
                    f"{stat.S_IMODE(info.st_mode):o}, no sticky bit): a student can put a course folder of their own "
                    f"in place of this one. Make it {stat.S_IMODE(info.st_mode) | stat.S_ISVTX:o} (chmod +t "
                    f"{self.root}, by whoever may), check that its folders are yours, then collect again")
        if self.coursedir.groupshared:  # instructors share the course by group: its folders are any of theirs
            return ""
        vouching = _hands_that_vouch()
        for folder in (os.path.dirname(self.inbound_path), self.inbound_path):
            owner = _user_name(os.lstat(folder).st_uid)
            if owner not in vouching:
                return (f"{folder} is owned by {owner}, not by you or root: a student may have put it there in "
                        f"place of the course's. Look at it, make it yours again (or move it aside and release "
                        f"again), then collect")
        return ""

    def copy_files(self):
        wrong = self._exchange_is_ours() if pwd is not None and self.src_records else ""
        if wrong:
            self.log.error("Nothing collected: %s.", wrong)
            raise ExchangeError(f"nothing collected: {wrong}")
        self._say_inbound_not_sticky()
        if pwd is not None and self.check_owner and self.src_records:
            owners = self._owners()
            self.src_records = [r for r in (self._own_record(r, owners) for r in self.src_records) if r is not None]
        records, failed = self.src_records, []
        if not records:
            super().copy_files()  # nbgrader's own "No submissions of ... to collect"
            return
        self._say_newer_left(records)
        self.log.info("Processing %d submissions of '%s' for course '%s'", len(records), self.coursedir.assignment_id,
                      self.coursedir.course_id)
        quiet = _Without("Processing 1 submissions")  # nbgrader's line, once per record below
        self.log.addFilter(quiet)
        try:  # one student's folder that cannot be copied never stops the others' (nbgrader's loop stops there)
            for record in records:
                self.src_records = [record]
                dest = self.coursedir.format_path(self.coursedir.submitted_directory, record["username"],
                                                  self.coursedir.assignment_id)
                with _kept_if_failed(dest) as earlier:
                    try:
                        self._redate(record, dest)
                        super().copy_files()
                    except Exception as err:  # noqa: BLE001 - reported below, and collect then fails
                        kept = earlier.restore()
                        self.log.error("%s: not collected (%s); %s. The other students' submissions are collected. "
                                       "Collect again once it is fixed (the exchange keeps it).",
                                       os.path.join(self.inbound_path, record["filename"]), err,
                                       "the copy collected before is kept" if kept else "nothing of theirs was collected")
                        failed.append(record["filename"])
        finally:
            self.src_records = records
            self.log.removeFilter(quiet)
        if failed:
            message = (f"{len(failed)} submission(s) could not be collected: {', '.join(failed)} (the errors above "
                       "say why); every other one was")
            self.log.error(message)  # nbgrader's app says only "nbgrader collect failed"
            raise ExchangeError(message)

    def _say_inbound_not_sticky(self) -> None:
        """A WARNING where students may rename or remove one another's submission folders: nbgrader makes the inbound
        733, and a student who learnt a classmate's folder name renamed it away (never collected, without a word) or
        renamed the notebook in it away and back (dated then: red team 14). The sticky bit stops both."""
        try:
            mode = os.stat(self.inbound_path).st_mode
        except OSError:
            return
        if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
            self.log.warning("The inbound folder %s lets every user rename or remove what is in it (mode %o, no sticky "
                             "bit): a student who learns a classmate's folder name can hide or re-date their "
                             "submission. Make it %o (chmod +t %s; nbgrader submit works as before).",
                             self.inbound_path, stat.S_IMODE(mode), stat.S_IMODE(mode) | stat.S_ISVTX,
                             self.inbound_path)

    def _say_newer_left(self, records: list[dict]) -> None:
        """A WARNING naming the students whose submission in the inbound is newer than the one collected before, when
        --update was not given: nbgrader leaves the collected one (logging only an INFO line, exit 0), and a grade run
        then grades the old notebook without a word (an instructor's first week)."""
        if self.update or self.before_duedate:
            return
        newer = []
        for record in records:
            dest = self.coursedir.format_path(self.coursedir.submitted_directory, record["username"],
                                              self.coursedir.assignment_id)
            if not os.path.isdir(dest):
                continue
            before = self.coursedir.get_existing_timestamp(dest)
            if before is not None and record["timestamp"] is not None and record["timestamp"] > before:
                newer.append(f"{record['username']} (collected: {before} UTC; in the exchange: {record['timestamp']} UTC)")
        if newer:
            self.log.warning("NOT COLLECTED: %d student(s) handed in %s again since it was collected, and without "
                             "--update the copy collected before stays: %s. Collect again with --update (nbgrader "
                             "collect %s --update), then grade again.", len(newer), self.coursedir.assignment_id,
                             ", ".join(newer), self.coursedir.assignment_id)

    def _redate(self, record: dict, dest: str) -> None:
        """A submission collected before, dated by the inbound's change the instructor has now named: removed, so that
        it is collected again with its claimed time (nbgrader's --update takes only a later time); `_kept_if_failed`
        puts it back if that copy fails."""
        if record["filename"] not in getattr(self, "_together", set()) or not os.path.isdir(dest):
            return
        before = self.coursedir.get_existing_timestamp(dest)
        if before is not None and before > record["timestamp"]:
            import shutil

            self.log.info("Dating again: %s %s, collected as of %s UTC, now %s UTC (the time its name claims).",
                          record["username"], self.coursedir.assignment_id, before, record["timestamp"])
            shutil.rmtree(dest)

    def _owners(self) -> dict[str, str | None]:
        """Each inbound entry (any student, any assignment) -> its owner (None: not a real folder)."""
        return {os.path.basename(p): owner_of(p) for p in glob.glob(os.path.join(self.inbound_path, "*+*+*"))}

    def _own_record(self, record: dict, owners: dict[str, str | None]) -> dict | None:
        """`record`, or the newest of the same student's own submissions when another user made it."""
        student = record["username"]
        owner = owners.get(record["filename"])
        if owner == student:
            return record
        if owner is not None and owner in _hands_that_vouch():
            return record  # put in by hand, by the instructor collecting (or root): nbgrader warns
        path = os.path.join(self.inbound_path, record["filename"])
        accounts = {who for who in owners.values() if who is not None}
        shared = (" Where one account owns every student's folder, as here (a hub whose users share one uid), owners "
                  "cannot vouch: set c.ExchangeCollect.check_owner = False.") if len(accounts) == 1 else ""
        self.log.error("%s claims to be %s's submission but is %s: not collected (anyone can write into the "
                       "exchange's inbound; only the student's own folders are theirs, or one the user collecting "
                       "put there).%s", path, student,
                       f"owned by {owner}" if owner else "not a folder of its own (a link, or unreadable)", shared)
        prefix = f"{student}+{self.coursedir.assignment_id}+"
        own = [self._path_to_record(os.path.join(self.inbound_path, name)) for name, who in owners.items()
               if name.startswith(prefix) and who == student]
        if self.duedate is not None and self.before_duedate:
            own = [r for r in own if r["timestamp"] <= self.duedate] or own
        if not own:
            self.log.error("%s has no submission of %s of their own in the exchange.", student,
                           self.coursedir.assignment_id)
            return None
        return self._sort_by_timestamp(own)[0]


def _hands_that_vouch() -> set[str]:
    """The accounts whose folder in the inbound is taken as the student it names: the user collecting (the
    instructor put it there by hand) and root. A folder another student made is never one of them: with no folder
    of the named student's own, it was collected as theirs (a student handed in a notebook in the name of a
    classmate who had not, and framed them with a library's softmax)."""
    try:
        me = pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:  # an account with no name (a container's uid): named as owner_of names it
        me = f"uid {os.geteuid()}"
    return {"root", me}


class ListWithoutExchangeSaidOnce(ExchangeList):
    """nbgrader's list; a missing or unwritable exchange folder is said once per process and folder, as a
    warning naming what is off and that grading needs none. It still fails as nbgrader's does (ExchangeError):
    formgrader turns its release and collect off, a student's Assignments tab shows nbgrader's own text."""

    _said: set[str] = set()

    def ensure_root(self) -> None:
        if check_directory(self.root, write=True, execute=True):
            return
        if self.root not in self._said:
            self._said.add(self.root)
            self.log.warning("No exchange folder at %s (missing, or not writable by this user): releasing and "
                             "collecting through the exchange are off. Grading needs none; to use one, see the "
                             "README (Exchange.root).", self.root)
        raise ExchangeError(f"Unwritable directory, please contact your instructor: {self.root}")
