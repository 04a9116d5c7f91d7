"""Tasks of a task file, as Ansible walks them: each task, then those of its block, rescue and always."""

SECTIONS = ("block", "rescue", "always")


def tasks_of(items):
    for task in items or []:
        if isinstance(task, dict):
            yield task
            for section in SECTIONS:
                yield from tasks_of(task.get(section))
