"""The pure rules: schedules and cron, timers, windows, groups, webhook targets and attempts,
failed fires, errors, numbers and times, the reference clock's bounds (from reads it is
given). No I/O, no clock read; imports nothing of the project but ``core``."""
