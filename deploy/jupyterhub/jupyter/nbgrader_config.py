"""nbgrader's settings for every server the course's JupyterHub starts (deploy/jupyterhub/jupyter is on
their JUPYTER_CONFIG_PATH): one course id and the shared exchange. The instructor's own server
releases and collects in their home folder (the course root nbgrader defaults to); the formgrader
service runs in the graded class's own course folder, whose nbgrader_config.py adds the rest."""
import os

c = get_config()  # noqa: F821 - provided by traitlets when nbgrader loads the file
c.CourseDirectory.course_id = os.environ.get("ATTN_HUB_COURSE_ID", "attention-step-by-step")
c.Exchange.root = os.environ.get("ATTN_HUB_EXCHANGE", "/srv/nbgrader/exchange")
# collect never takes a submission another user put in a student's name (the inbound is writable by all)
c.ExchangeFactory.collect = "autograder.exchange.OwnerCheckedCollect"
