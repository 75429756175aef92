"""Coder Eval results and reports: the task.json/run.json schema (`models`) and the files a
run leaves behind (`render`: run.json, run.md, task.html, per-replicate task.json)."""
