"""The engine: step = schedule -> execute -> update."""
