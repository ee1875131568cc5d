"""Faults the checker arms at run time, each through a `/_ctl` route of the server it acts in: failpoints, hooks
that raise, storage faults, lost replies, timeouts that follow a moved wall clock, and the journal a power cut
reads. The planted bugs a deployment starts with are another catalogue (`fakes.faults`)."""
