"""The deployment seam (`seam`) and the harness the machines drive through it (`harness`), split into the roles its
callers use: start and crash (`lifecycle`), observe (`observe`, with the one back-off poll every wait uses), the
gated backend (`gate`), the clocks (`clocks`) and the faults (`faults`); the system is the look-alike stack found by
entry point, with its planted faults (`catalogue`), or a real Gym (`gym`, `process_groups`, `preflight`); what a run
keeps, and collection runs."""
