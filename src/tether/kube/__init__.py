"""A thin asyncio Kubernetes layer: kubeconfig, REST calls, list and watch."""
