"""`make hub-e2e`: the course on a real JupyterHub, end to end, on 127.0.0.1.

It starts deploy/jupyterhub/jupyterhub_config.py (the file a department copies) as root with three local
Unix users (an instructor and two students), and drives a whole assignment through the hub's and
nbgrader's own HTTP interfaces, the ones the Lab buttons call:

1. the instructor's server releases notebook 01 to the exchange (formgrader's release API);
2. each student's server lists and fetches it (nbgrader's assignment list), the notebook is saved through
   Jupyter's contents API (one student solves it, the other makes a catalogued mistake) and submitted;
3. the instructor's server collects; the instructor runs `attn-course grade` on what was collected,
   as that Unix user (sandboxed, as in their terminal);
4. the formgrader service, behind the hub's login, shows the grades and releases the feedback;
5. each student fetches their feedback page and it shows their score.

The last line is `hub-e2e: graded N students`. Everything is cleaned up afterwards (the users are
removed with their homes; --keep leaves them and the hub's folder for a look).
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from autograder.course import notebook_path

from . import demo
from .net import free_port

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "deploy" / "jupyterhub" / "jupyterhub_config.py"
ASSIGNMENT = "01_similarity_attention"
COURSE_ID = "attention-step-by-step"
INSTRUCTOR = "attnhub-teacher"
STUDENTS = ("attnhub-alice", "attnhub-bob")  # alice solves the notebook; bob makes DEMO_MISTAKES' mistake


class HubE2EError(RuntimeError):
    pass


def say(message: str) -> None:
    print(f"hub-e2e: {message}", flush=True)


def run(*command: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if check and done.returncode != 0:
        raise HubE2EError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


# --------------------------------------------------------------------------- local users
def home(user: str) -> Path:
    return Path(os.path.expanduser(f"~{user}"))


def fresh_user(user: str) -> None:
    """A new local account with an empty home (an earlier run's account is removed first)."""
    if run("id", "-u", user, check=False).returncode == 0:
        remove_user(user)
    run("useradd", "--create-home", "--shell", "/bin/bash", user)


def remove_user(user: str) -> None:
    run("pkill", "-KILL", "-u", user, check=False)
    time.sleep(0.5)
    run("userdel", "--remove", "--force", user, check=False)


def give(user: str, path: Path) -> None:
    """chown -R user: the instructor's release folder is theirs, as if they had made it."""
    shutil.chown(path, user, user)
    for inner in path.rglob("*"):
        shutil.chown(inner, user, user)


# --------------------------------------------------------------------------- the hub
@dataclass
class Hub:
    url: str
    driver_token: str
    process: subprocess.Popen
    log: Path

    def api(self, method: str, path: str, **kwargs):
        import requests

        response = requests.request(method, f"{self.url}/hub/api{path}", timeout=60,
                                    headers={"Authorization": f"token {self.driver_token}"}, **kwargs)
        if response.status_code >= 400:
            raise HubE2EError(f"hub API {method} {path}: {response.status_code} {response.text[:500]}\n{self.tail()}")
        return response.json() if response.content else None

    def tail(self, chars: int = 4000) -> str:
        return f"--- the hub's log ({self.log}), last lines:\n{self.log.read_text(errors='replace')[-chars:]}"


def start_hub(workspace: Path, venv_bin: Path, students: tuple[str, ...]) -> Hub:
    state, exchange = workspace / "state", workspace / "exchange"
    state.mkdir(mode=0o700)
    exchange.mkdir()
    exchange.chmod(0o1777)                    # every user writes into it; the sticky bit: none renames another's
    port = free_port()
    token = secrets.token_hex(32)
    env = {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
           "ATTN_HUB_URL": f"http://127.0.0.1:{port}", "ATTN_HUB_API_PORT": str(free_port()),
           "ATTN_HUB_PROXY_API": f"http://127.0.0.1:{free_port()}", "ATTN_HUB_FORMGRADER_PORT": str(free_port()),
           "ATTN_HUB_STATE": str(state), "ATTN_HUB_EXCHANGE": str(exchange), "ATTN_HUB_COURSE_ROOT": str(REPO),
           "ATTN_HUB_VENV_BIN": str(venv_bin), "ATTN_HUB_INSTRUCTOR": INSTRUCTOR,
           "ATTN_HUB_STUDENTS": ",".join(students), "ATTN_HUB_COURSE_ID": COURSE_ID,
           "ATTN_HUB_GRADING": str(home(INSTRUCTOR) / "grading"), "ATTN_HUB_DRIVER_TOKEN": token}
    log = workspace / "jupyterhub.log"
    process = subprocess.Popen([str(venv_bin / "jupyterhub"), "-f", str(CONFIG)], cwd=state, env=env,
                               stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    hub = Hub(f"http://127.0.0.1:{port}", token, process, log)
    wait_for(lambda: _answers(f"{hub.url}/hub/api"), 180, "JupyterHub to answer", hub)
    return hub


def stop_hub(hub: Hub) -> None:
    """SIGTERM (the hub stops the servers it started), then SIGKILL for whatever is left of its group."""
    if hub.process.poll() is None:
        os.killpg(hub.process.pid, signal.SIGTERM)
        try:
            hub.process.wait(60)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(hub.process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _answers(url: str) -> bool:
    import requests

    try:
        return requests.get(url, timeout=5).status_code == 200     # 404 until the hub has added its route
    except requests.RequestException:
        return False


def wait_for(ready, seconds: float, what: str, hub: Hub | None = None):
    """Poll ready() every second until it returns something true; HubE2EError naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if hub is not None and hub.process.poll() is not None:
            raise HubE2EError(f"JupyterHub exited ({hub.process.returncode}) while waiting for {what}\n{hub.tail()}")
        value = ready()
        if value:
            return value
        time.sleep(1)
    raise HubE2EError(f"gave up after {seconds:.0f} s waiting for {what}" + (f"\n{hub.tail()}" if hub else ""))


# --------------------------------------------------------------------------- a user's session
class User:
    """One user's view of the hub: their own API token (made by the driver service, as an admin would),
    their single-user server started through the hub's REST API."""

    def __init__(self, hub: Hub, name: str):
        import requests

        self.hub, self.name = hub, name
        token = hub.api("POST", f"/users/{name}/tokens", json={"note": "hub-e2e", "expires_in": 3600})["token"]
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"token {token}"

    def start_server(self) -> None:
        self.hub.api("POST", f"/users/{self.name}/server")

    def server_ready(self) -> bool:
        server = (self.hub.api("GET", f"/users/{self.name}").get("servers") or {}).get("")
        return bool(server and server.get("ready"))

    def call(self, method: str, path: str, expect_json: bool = True, **kwargs):
        """`path` under the hub's address (/user/NAME/... or /services/...); the JSON answer."""
        response = self.session.request(method, f"{self.hub.url}{path}", timeout=300, **kwargs)
        if response.status_code >= 400:
            raise HubE2EError(f"{self.name}: {method} {path}: {response.status_code} {response.text[:800]}")
        return response.json() if expect_json else response

    def server(self, method: str, path: str, **kwargs):
        return self.call(method, f"/user/{self.name}{path}", **kwargs)

    def nbgrader(self, action: str) -> dict:
        """The assignment list's fetch / submit / fetch_feedback buttons."""
        answer = self.server("POST", f"/assignments/{action}",
                             data={"course_id": COURSE_ID, "assignment_id": ASSIGNMENT})
        if isinstance(answer, dict) and not answer.get("success", True):
            raise HubE2EError(f"{self.name}: nbgrader {action} failed: {answer.get('value', answer)}")
        return answer


def validate(student: User) -> str:
    """Lab's Validate button on the saved notebook (the course's sandboxed `attn-course check`): alice's
    report has no FAIL, bob's names his catalogued mistake. A student's server has no formgrader."""
    if student.session.get(f"{student.hub.url}/user/{student.name}/formgrader/api/assignments",
                           timeout=60).status_code != 404:
        raise HubE2EError(f"{student.name}'s server answers formgrader's API: it must be off for students")
    answer = student.server("POST", "/assignments/validate", params={"path": f"{ASSIGNMENT}/{ASSIGNMENT}.ipynb"})
    report = answer["value"]["failed"][0]["error"]
    module, graded, mistake, _ = demo.DEMO_MISTAKES[ASSIGNMENT]
    if student.name == STUDENTS[0] and ("FAIL" in report or "PASS" not in report):
        raise HubE2EError(f"Validate on {student.name}'s solved notebook did not pass everything: {report[:1500]}")
    if student.name == STUDENTS[1] and mistake.split(" (")[0] not in report:
        raise HubE2EError(f"Validate on {student.name}'s notebook does not name the mistake {mistake!r}: {report[:1500]}")
    return "all PASS" if student.name == STUDENTS[0] else f"FAIL: {mistake}"


def succeeded(answer: dict, what: str) -> dict:
    if not answer.get("success"):
        raise HubE2EError(f"{what} failed: {json.dumps(answer)[:2000]}")
    return answer


# --------------------------------------------------------------------------- the scenario
def notebooks() -> dict[str, nbformat.NotebookNode]:
    """What each student saves: alice the reference solution, bob the demo class's catalogued mistake."""
    release = nbformat.read(REPO / "notebooks" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    full = demo.solved(release, nbformat.read(notebook_path(ASSIGNMENT), as_version=4))
    module, graded, name, _ = demo.DEMO_MISTAKES[ASSIGNMENT]
    return {STUDENTS[0]: full, STUDENTS[1]: demo.with_mistake(full, graded, demo.find_mistake(module, graded, name))}


def scenario(hub: Hub, venv_bin: Path) -> dict[str, tuple[float, float]]:
    teacher = User(hub, INSTRUCTOR)
    students = [User(hub, name) for name in STUDENTS]
    everyone = [teacher, *students]
    for user in everyone:
        user.start_server()
    for user in everyone:
        wait_for(user.server_ready, 300, f"{user.name}'s server to start", hub)
    say(f"the hub started {len(everyone)} servers, each as its own Unix user")

    # 1. release: the student version in the instructor's release/ folder, released by formgrader
    release = home(INSTRUCTOR) / "release" / ASSIGNMENT
    release.mkdir(parents=True)
    shutil.copy2(REPO / "notebooks" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", release)
    give(INSTRUCTOR, release.parent)
    succeeded(teacher.server("POST", f"/formgrader/api/assignment/{ASSIGNMENT}/release"), "release")
    say(f"{INSTRUCTOR} released {ASSIGNMENT} to the exchange")

    # 2. each student: the assignment list shows it; fetch, save, submit
    for student, nb in zip(students, notebooks().values(), strict=True):
        listed = succeeded(student.server("GET", "/assignments", params={"course_id": COURSE_ID}), "assignment list")
        if not any(a.get("assignment_id") == ASSIGNMENT for a in listed["value"]):
            raise HubE2EError(f"{student.name}'s assignment list does not show {ASSIGNMENT}: {listed}")
        student.nbgrader("fetch")
        student.server("PUT", f"/api/contents/{ASSIGNMENT}/{ASSIGNMENT}.ipynb",
                       json={"type": "notebook", "format": "json", "content": nb})
        report = validate(student)
        student.nbgrader("submit")
        say(f"{student.name} fetched, saved, validated ({report}) and submitted {ASSIGNMENT}")

    # 3. collect, then grade what was collected, as the instructor
    succeeded(teacher.server("POST", f"/formgrader/api/assignment/{ASSIGNMENT}/collect"), "collect")
    submitted = home(INSTRUCTOR) / "submitted"
    collected = sorted(p.name for p in submitted.iterdir()) if submitted.is_dir() else []
    if collected != sorted(STUDENTS):
        raise HubE2EError(f"collect brought {collected}, not {sorted(STUDENTS)}")
    grading = home(INSTRUCTOR) / "grading"
    graded = run("runuser", "-u", INSTRUCTOR, "--", "env", "-i", f"PATH={venv_bin}:/usr/bin:/bin",
                 f"HOME={home(INSTRUCTOR)}", f"ATTN_COURSE_ROOT={REPO}",
                 str(venv_bin / "attn-course"), "grade", str(submitted), "--out", str(grading),
                 "--assignment", ASSIGNMENT, check=False, timeout=1800)
    if graded.returncode != 0:
        raise HubE2EError(f"attn-course grade failed ({graded.returncode}):\n{graded.stdout[-3000:]}\n{graded.stderr[-3000:]}")
    say(f"{INSTRUCTOR} collected {len(collected)} submissions and graded them with attn-course grade")

    # 4. the formgrader service, behind the hub's login: the grades, then the feedback released
    formgrader = "/services/formgrader/formgrader/api"
    rows = wait_for(lambda: _service_answer(teacher, f"{formgrader}/submissions/{ASSIGNMENT}"), 180,
                    "the formgrader service to open the graded class", hub)
    scores = {row["student"]: (float(row["score"]), float(row["max_score"])) for row in rows}
    if set(scores) != set(STUDENTS):
        raise HubE2EError(f"formgrader shows {sorted(scores)}, not {sorted(STUDENTS)}")
    succeeded(teacher.call("POST", f"{formgrader}/assignment/{ASSIGNMENT}/release_feedback"), "release_feedback")
    say("formgrader (a hub service) shows " + ", ".join(f"{s} {a:g}/{b:g}" for s, (a, b) in scores.items())
        + " and released the feedback")

    # 5. each student fetches the feedback page, and it shows their score
    for student in students:
        student.nbgrader("fetch_feedback")
        folder = student.server("GET", f"/api/contents/{ASSIGNMENT}/feedback")
        pages = [item["path"] for stamp in folder["content"] if stamp["type"] == "directory"
                 for item in student.server("GET", f"/api/contents/{stamp['path']}")["content"]
                 if item["name"].endswith(".html")]
        if not pages:
            raise HubE2EError(f"{student.name} fetched no feedback page: {folder}")
        html = student.server("GET", f"/api/contents/{pages[0]}", params={"type": "file", "format": "text"})["content"]
        score, total = scores[student.name]
        if not any(f"{score:{f}} / {total:{f}}" in html for f in ("g", ".1f")) or "BEGIN HIDDEN TESTS" in html:
            raise HubE2EError(f"{student.name}'s feedback page does not show {score:g} / {total:g} (or shows hidden tests)")
    say("each student fetched a feedback page showing their score")
    return scores


def _service_answer(user: User, path: str):
    response = user.session.get(f"{user.hub.url}{path}", timeout=60)
    if response.status_code != 200:
        return None
    try:
        return response.json()      # formgrader's answer (its API sends JSON as text/html)
    except ValueError:
        return None                 # the placeholder's sentence: not graded yet


def expected_scores(scores: dict[str, tuple[float, float]]) -> None:
    """alice full marks; bob exactly the points of the demo mistake's test cells fewer (and not zero)."""
    (a_score, total), (b_score, _) = scores[STUDENTS[0]], scores[STUDENTS[1]]
    if a_score != total or not 0 < b_score < total:
        raise HubE2EError(f"unexpected grades: {STUDENTS[0]} {a_score:g}/{total:g} (full marks expected), "
                          f"{STUDENTS[1]} {b_score:g}/{total:g} (the catalogued mistake costs some points, not all)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="leave the users, their homes and the hub's folder")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("hub-e2e: needs root: it creates local Unix users and runs JupyterHub as root, as a department "
              "deployment does (run it in CI, a container or a VM)", file=sys.stderr)
        return 2
    venv_bin = Path(sys.executable).parent
    for tool in ("jupyterhub", "jupyterhub-singleuser", "configurable-http-proxy"):
        if not (venv_bin / tool).exists():
            print(f"hub-e2e: {venv_bin / tool} is missing: `make venv` installs JupyterHub from requirements.txt",
                  file=sys.stderr)
            return 2
    workspace = Path(tempfile.mkdtemp(prefix="attn-hub-e2e-"))
    workspace.chmod(0o755)
    hub = None
    try:
        for user in (INSTRUCTOR, *STUDENTS):
            fresh_user(user)
        say(f"local users {INSTRUCTOR} (instructor), {', '.join(STUDENTS)} (students)")
        hub = start_hub(workspace, venv_bin, STUDENTS)
        say(f"JupyterHub answers at {hub.url} ({CONFIG.relative_to(REPO)})")
        scores = scenario(hub, venv_bin)
        expected_scores(scores)
    except HubE2EError as err:
        print(f"hub-e2e: FAILED: {err}", file=sys.stderr)
        return 1
    finally:
        if hub is not None:
            stop_hub(hub)
        if not args.keep:
            for user in (INSTRUCTOR, *STUDENTS):
                remove_user(user)
            shutil.rmtree(workspace, ignore_errors=True)
    say(f"graded {len(scores)} students")
    return 0


if __name__ == "__main__":
    sys.exit(main())
