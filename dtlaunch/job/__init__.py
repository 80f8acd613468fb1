"""What a job is made of, pure: hosts and slots, the ranks' environment, commands, binding."""
