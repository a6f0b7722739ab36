"""What reads run records and shapes no result: identities, leaderboard, claims, compare, plots."""
