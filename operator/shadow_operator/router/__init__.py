"""router-auth: the decision service behind the nginx router (previews by Host, the SDK by X-Sandbox-* headers).

nginx proxies every byte; for each request it asks this service (`auth_request`, cached a few seconds) which
upstream a request may reach. The service answers from an in-memory index fed by watches of Sandboxes, their
Pods and (for the SDK path) their runtime token Secrets, so only sandboxes the operator manages are
reachable. Layout: `tokens` (signed preview links), `validation` (Host and header rules), `index` (what is
routable), `decisions` (what one request may reach), `access` (who may use the SDK path: TokenReview and
SubjectAccessReview), `watch` (list + watch into the index), `app` (the HTTP endpoints nginx calls), `links`
(a signed link for a sandbox).
"""
