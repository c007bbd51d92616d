"""The wake scheduler: turns WAKE decisions into budgeted, collected agent runs."""
