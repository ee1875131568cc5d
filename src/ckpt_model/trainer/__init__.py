"""The trainer controller: the Hypothesis state machine playing the training controller, the controller that performs
and journals every operation, the settle, the audits and watchers that call the properties after each step, the
kills, and one module per fault family (`nemeses/`)."""
