"""router-auth: the decision service behind the nginx router (previews by Host, the SDK by X-Sandbox-* headers).

nginx proxies every byte; for each request it asks this service (`auth_request`, cached a few seconds) which
upstream a request may reach. The service answers from an in-memory index fed by watches of Sandboxes and
their Pods, so only sandboxes the operator manages are reachable; Secrets are never listed or watched. Layout:
`validation` (Host and header rules), `index` (what is routable), `decisions` (what one request may reach;
preview links verified with the keys of the sandbox's namespace), `access` (who may use the SDK path:
TokenReview and SubjectAccessReview), `secrets` (a sandbox's runtime token, read by name), `watch` (list +
watch into the index), `app` (the HTTP endpoints nginx calls).
"""
