# Lab's terminals, for `attn-course lab` only (this folder is on JUPYTER_CONFIG_PATH there): the
# user's own shell, interactive but not a login shell. jupyter_server_terminals starts a login
# shell whenever the server's output is not a terminal, and a login shell on Debian or Ubuntu
# resets PATH (/etc/profile), so the course's tools (`attn-course check`, which the notebooks tell
# students to run there) were not found. The server's PATH, with the course's tools first, is kept.
import os
import shutil

c = get_config()  # noqa: F821 - provided by traitlets when Jupyter loads the file
c.ServerApp.terminado_settings = {"shell_command": [os.environ.get("SHELL") or shutil.which("bash") or "sh"]}
