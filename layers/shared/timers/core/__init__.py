"""The pure rules: schedules and cron, timers, windows, groups, webhook targets and attempts,
failed fires, errors, numbers and times. No I/O, no clock read; imports nothing of the
project but ``core``."""
