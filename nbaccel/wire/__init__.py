"""What crosses between a rank and the kernel: framed events, and functions carried by value."""
