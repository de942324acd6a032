"""Selection: the exact top-k of the highest surprisals (radix select; the fused CPU kernel; over ranks)."""

PUBLIC_MODULES = ["distributed", "native", "radix"]
