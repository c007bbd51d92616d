"""Copy trading on the follower's side: what the leaders hold, as their signals say."""
