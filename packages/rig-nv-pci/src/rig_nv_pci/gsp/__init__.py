"""The GSP's message queues and the RPCs the kernel half of the RM sends through them."""
