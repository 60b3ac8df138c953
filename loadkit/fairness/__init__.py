"""`python -m loadkit fairness`: issue 28's VTC suites against this service, scaled to the measured capacity.

`plan` owns the suites, the systems (tenant configurations inside one service config) and the arrival schedules;
`account` the figures computed from the answers (weighted service per window, backlogged gaps, overrun); `render`
the tables and the SVG plot; `drive` the HTTP clients; `run` the command line and the order of the runs.
"""
