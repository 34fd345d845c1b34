"""Pure authority decisions: config schema, permission modes, argv, child environment, workspace
containment and resume-id rules. The daemon asks policy and obeys. No I/O: whatever policy needs
to know about the world (files, the environment, the run store) comes in as an argument.
"""
