"""The stack's processes: each server the leader of its own process group, started and health-waited, killed and
reaped (`server_processes`, `process_groups`), on a reserved port (`ports`), forked warm from the fork server
(`zygote`, driven through `zygote_client` over `zygote_protocol`)."""
