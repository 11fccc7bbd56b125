"""The instructor's formgrader as a JupyterHub service (deploy/jupyterhub/jupyterhub_config.py starts it):
nbgrader's formgrader on the class `attn-course grade --out GRADING` graded, behind the hub's login.

formgrader reads its course's nbgrader_config.py from its working folder when it starts, and the graded
class exists only after the first `attn-course grade`. The hub, though, checks that its services answer
when it starts. So until GRADING/course exists this answers every request on the service's port with
503 and a sentence saying what to run; then it becomes the hub's single-user server in that folder, with
formgrader on: the server `attn-course formgrader GRADING` runs, behind the hub's login instead of a token."""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def placeholder(port: int, prefix: str, message: str) -> ThreadingHTTPServer:
    """A server on 127.0.0.1:port answering `message`, in a thread: 200 at the service's own address (the
    hub's check when it starts), 503 everywhere else (formgrader's pages and API are not there yet)."""
    body = message.encode()

    class NotYet(BaseHTTPRequestHandler):
        def _answer(self):
            self.send_response(200 if self.path.split("?")[0].rstrip("/") == prefix.rstrip("/") else 503)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_HEAD = _answer

        def log_message(self, *args) -> None:  # the hub's log shows the waiting once, not every poll
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), NotYet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grading", type=Path, help="the folder `attn-course grade --out` writes")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    course = args.grading.expanduser() / "course"
    if not ((course / "nbgrader_config.py").is_file() and (course.parent / "gradebook.db").is_file()):
        message = (f"formgrader opens once the class is graded: run `attn-course grade SUBMISSIONS --out "
                   f"{args.grading}` (nothing graded in {course} yet)")
        print(f"formgrader service: {message}", flush=True)
        waiting = placeholder(args.port, os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/"), message + "\n")
        while not ((course / "nbgrader_config.py").is_file() and (course.parent / "gradebook.db").is_file()):
            time.sleep(2)
        time.sleep(2)                     # `attn-course grade` writes the course first, the gradebook after
        waiting.shutdown()
        waiting.server_close()
    from autograder.outputs import formgrader_policy_option

    singleuser = Path(sys.executable).parent / "jupyterhub-singleuser"
    os.chdir(course)
    os.execv(str(singleuser), [str(singleuser), f"--ServerApp.root_dir={course}", "--ServerApp.ip=127.0.0.1",
                               f"--ServerApp.port={args.port}", "--ServerApp.port_retries=0",
                               "--ServerApp.jpserver_extensions", "nbgrader.server_extensions.formgrader=True",
                               formgrader_policy_option()])  # no picture from another host: autograder.outputs


if __name__ == "__main__":
    main()
