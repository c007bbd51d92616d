"""Feed plugins: each turns an outside source into FeedEvents on the bus."""
