"""The dispatcher: scheduling state, control flow and the loop that settles units."""
