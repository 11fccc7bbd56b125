"""JupyterHub for the course: local Unix users, each student's own Jupyter server running the course's
environment, nbgrader's exchange on a shared folder, and the instructor's formgrader as a hub service.

Copy this file, set the ATTN_HUB_* variables (or edit the defaults below) and start the hub as root:

    ATTN_HUB_COURSE_ROOT=/opt/attention-course ATTN_HUB_INSTRUCTOR=grader-attention \
        jupyterhub -f deploy/jupyterhub/jupyterhub_config.py

`make hub-e2e` (course_tools/hub_e2e.py) starts this very file on 127.0.0.1 with three local users and
drives release, fetch, submit, collect, `attn-course grade`, release_feedback and fetch_feedback through it.
"""
import os
from pathlib import Path

c = get_config()  # noqa: F821 - provided by traitlets when JupyterHub loads the file

HERE = Path(__file__).resolve().parent
COURSE_ROOT = Path(os.environ.get("ATTN_HUB_COURSE_ROOT", HERE.parent.parent))      # the course checkout
VENV_BIN = Path(os.environ.get("ATTN_HUB_VENV_BIN", COURSE_ROOT / ".venv" / "bin"))  # `make venv` made it
COURSE_ID = os.environ.get("ATTN_HUB_COURSE_ID", "attention-step-by-step")
EXCHANGE = os.environ.get("ATTN_HUB_EXCHANGE", "/srv/nbgrader/exchange")               # chmod 1777: every user writes, none renames what another made
INSTRUCTOR = os.environ.get("ATTN_HUB_INSTRUCTOR", "grader-attention")               # a Unix account
STUDENTS = [s for s in os.environ.get("ATTN_HUB_STUDENTS", "").split(",") if s]       # empty: any local user
GRADING = os.environ.get("ATTN_HUB_GRADING", f"~{INSTRUCTOR}/grading")              # `attn-course grade --out`

# --- the hub: on one address, behind the proxy it starts (configurable-http-proxy, from the course's venv)
c.JupyterHub.bind_url = os.environ.get("ATTN_HUB_URL", "http://127.0.0.1:8000")
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = int(os.environ.get("ATTN_HUB_API_PORT", "8081"))
c.ConfigurableHTTPProxy.command = [str(VENV_BIN / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.api_url = os.environ.get("ATTN_HUB_PROXY_API", "http://127.0.0.1:8001")
state = Path(os.environ.get("ATTN_HUB_STATE", "/srv/jupyterhub"))                     # the hub's database and secret
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(state / "jupyterhub.pid")

# --- who logs in: local Unix users with their passwords (PAM, JupyterHub's default)
c.Authenticator.allowed_users = set(STUDENTS) | {INSTRUCTOR} if STUDENTS else set()
c.Authenticator.allow_all = not STUDENTS
c.Authenticator.admin_users = {INSTRUCTOR}

# --- each user's server: the course's environment, as that Unix user, in their home folder
c.Spawner.cmd = [str(VENV_BIN / "jupyterhub-singleuser")]
c.Spawner.notebook_dir = "~"
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = int(os.environ.get("ATTN_HUB_START_TIMEOUT", "180"))
c.Spawner.http_timeout = int(os.environ.get("ATTN_HUB_START_TIMEOUT", "180"))
SERVER_ENV = {
    "PATH": f"{VENV_BIN}{os.pathsep}/usr/local/bin:/usr/bin:/bin",                    # attn-course, nbgrader
    "ATTN_COURSE_ROOT": str(COURSE_ROOT),                                            # the self-check's course
    "JUPYTER_CONFIG_PATH": str(HERE / "jupyter"),                                    # see jupyter/README.md
    "JUPYTER_PATH": str(COURSE_ROOT / "course_tools" / "jupyter_data"),              # the Validate button
    "ATTN_HUB_COURSE_ID": COURSE_ID,
    "ATTN_HUB_EXCHANGE": EXCHANGE,
}
c.Spawner.environment = dict(SERVER_ENV)


def settings_by_role(spawner) -> None:
    """The instructor's server gets formgrader (release, collect); a student's the assignment list and
    the course's Validate button only (jupyter/student, jupyter/instructor)."""
    role = "instructor" if spawner.user.name == INSTRUCTOR else "student"
    spawner.environment["JUPYTER_CONFIG_PATH"] = os.pathsep.join([str(HERE / "jupyter" / role), str(HERE / "jupyter")])


c.Spawner.pre_spawn_hook = settings_by_role

# --- the instructor's formgrader on the graded class, as a hub service at /services/formgrader/formgrader
# (run as the instructor, on the class `attn-course grade --out GRADING` writes; open to the instructor only)
formgrader_port = int(os.environ.get("ATTN_HUB_FORMGRADER_PORT", "9999"))
c.JupyterHub.services = [{
    "name": "formgrader",
    "url": f"http://127.0.0.1:{formgrader_port}",
    # waits for the graded class, then serves formgrader in it (course_tools/hub_formgrader.py)
    "command": [str(VENV_BIN / "python"), "-m", "course_tools.hub_formgrader", os.path.expanduser(GRADING),
                f"--port={formgrader_port}"],
    "user": INSTRUCTOR,
    "cwd": str(Path(os.path.expanduser(f"~{INSTRUCTOR}"))),
    "environment": {**SERVER_ENV, "JUPYTERHUB_DEFAULT_URL": "/formgrader",
                    "JUPYTER_CONFIG_PATH": os.pathsep.join([str(HERE / "jupyter" / "instructor"), str(HERE / "jupyter")])},
    "oauth_no_confirm": True,
}]
c.JupyterHub.load_roles = [
    {"name": "instructor", "users": [INSTRUCTOR], "scopes": ["access:services!service=formgrader", "self"]},
]

# --- an automated driver (make hub-e2e): a service with an API token, allowed to start servers and
# to make tokens for the course's users. Absent unless ATTN_HUB_DRIVER_TOKEN is set.
if os.environ.get("ATTN_HUB_DRIVER_TOKEN"):
    c.JupyterHub.services.append({"name": "hub-e2e", "api_token": os.environ["ATTN_HUB_DRIVER_TOKEN"]})
    c.JupyterHub.load_roles.append({"name": "hub-e2e", "services": ["hub-e2e"],
                                    "scopes": ["admin:users", "admin:servers", "tokens", "list:users"]})
