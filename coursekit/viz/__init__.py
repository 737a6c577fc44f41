"""viz: figures and explorers; they read results, they never run algorithms of their own."""
