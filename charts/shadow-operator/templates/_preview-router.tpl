{{/* Namespace of the router's own objects. */}}
{{- define "shadow-operator.routerNamespace" -}}
{{- default .Release.Namespace .Values.previewRouter.namespace }}
{{- end }}

{{/* Namespaces whose sandboxes the router reaches, comma-separated (default: the default template's and the
tenants' namespaces). */}}
{{- define "shadow-operator.routerSandboxNamespaces" -}}
{{- if .Values.previewRouter.sandboxNamespaces }}
{{- join "," (uniq .Values.previewRouter.sandboxNamespaces) }}
{{- else }}
{{- prepend (include "shadow-operator.tenantNamespaces" . | fromJsonArray) (include "shadow-operator.templateNamespace" .) | uniq | join "," }}
{{- end }}
{{- end }}

{{- define "shadow-operator.routerKeysSecret" -}}
{{- default (printf "%s-preview-keys" (include "shadow-operator.fullname" .)) .Values.previewRouter.keysSecret }}
{{- end }}

{{/* The auth subrequest of a preview (cached per host and credentials). A request for a sleeping sandbox is
held in router-auth until it wakes: the read timeout is longer than the hold. */}}
{{- define "shadow-operator.previewAuth" -}}
{{- $r := .Values.previewRouter -}}
proxy_http_version 1.1;
proxy_method GET;
proxy_pass_request_body off;
proxy_set_header Content-Length "";
proxy_set_header Connection "";
proxy_set_header Upgrade "";
proxy_set_header X-Original-Host $host;
proxy_set_header X-Original-URI $request_uri;
proxy_read_timeout {{ add (int $r.holdSeconds) 10 }}s;
proxy_cache shadow_auth;
proxy_cache_key "preview|$host|$http_cookie|$http_x_shadow_preview_token|$arg_shadow_token";
proxy_cache_valid 200 {{ $r.authCacheSeconds }}s;
proxy_ignore_headers Cache-Control Expires Set-Cookie Vary X-Accel-Expires;
{{- end }}

{{/* A preview request, once allowed: to the upstream router-auth named. */}}
{{- define "shadow-operator.previewProxy" -}}
{{- $r := .Values.previewRouter -}}
auth_request_set $shadow_upstream $upstream_http_x_shadow_upstream;
auth_request_set $shadow_sandbox $upstream_http_x_shadow_sandbox;
proxy_pass http://$shadow_upstream;
proxy_http_version 1.1;
proxy_set_header Host $host;
proxy_set_header Upgrade $http_upgrade;
proxy_set_header Connection $connection_upgrade;
proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
proxy_set_header X-Forwarded-Proto {{ $r.scheme }};
proxy_set_header X-Forwarded-Host $host;
proxy_set_header X-Shadow-Preview-Token "";
proxy_read_timeout {{ $r.timeoutSeconds }}s;
proxy_send_timeout {{ $r.timeoutSeconds }}s;
# Streams (SSE, long polls) pass through as they come; uploads stream to the sandbox too.
proxy_buffering off;
proxy_request_buffering off;
{{- end }}

{{- define "shadow-operator.sdkAuth" -}}
{{- $r := .Values.previewRouter -}}
proxy_http_version 1.1;
proxy_method GET;
proxy_pass_request_body off;
proxy_set_header Content-Length "";
proxy_set_header Connection "";
proxy_set_header Upgrade "";
proxy_set_header X-Shadow-Peer $remote_addr;
proxy_read_timeout {{ add (int $r.holdSeconds) 10 }}s;
proxy_cache shadow_auth;
proxy_cache_key "sdk|$remote_addr|$http_x_sandbox_id|$http_x_sandbox_namespace|$http_x_sandbox_port|$http_x_sandbox_pod_ip|$http_x_sandbox_uid|$http_authorization";
proxy_cache_valid 200 {{ $r.authCacheSeconds }}s;
proxy_ignore_headers Cache-Control Expires Set-Cookie Vary X-Accel-Expires;
{{- end }}

{{- define "shadow-operator.sdkProxy" -}}
{{- $r := .Values.previewRouter -}}
auth_request_set $shadow_upstream $upstream_http_x_shadow_upstream;
auth_request_set $shadow_runtime_token $upstream_http_x_shadow_runtime_token;
auth_request_set $shadow_sandbox $upstream_http_x_shadow_sandbox;
proxy_pass http://$shadow_upstream;
proxy_http_version 1.1;
proxy_set_header Host $shadow_upstream;
proxy_set_header Authorization "";
# Always set by the router: empty (not sent) unless the request goes to the sandbox's runtime port.
proxy_set_header X-Sandbox-Runtime-Token $shadow_runtime_token;
proxy_set_header Upgrade $http_upgrade;
proxy_set_header Connection $connection_upgrade;
proxy_read_timeout {{ $r.timeoutSeconds }}s;
proxy_send_timeout {{ $r.timeoutSeconds }}s;
proxy_buffering off;
proxy_request_buffering off;
{{- end }}

{{/*
nginx configuration of the router (included in the image's http block); also hashed into the Deployment to
roll it on change. nginx proxies; router-auth (loopback) decides, through auth_request: 200 carries the
upstream (the managed sandbox pod's IP and port), 401/403 send the request to router-auth's page for the
real answer (404, 503, 401, the cookie redirect, JSON errors for the SDK). Allowed answers are cached for
authCacheSeconds. No DNS: upstreams are pod IPs, so nginx never resolves a name a Host header chose.
*/}}
{{- define "shadow-operator.previewRouterConf" -}}
{{- $r := .Values.previewRouter -}}
map $http_upgrade $connection_upgrade {
  default upgrade;
  ''      close;
}
{{- if $r.metrics.enabled }}
# Metrics: one line per routed request to router-auth (UDP on loopback), which counts it under the sandbox its
# own decision named ($shadow_sandbox, from the auth answer): refused requests have none and are not sent.
log_format shadow_metrics_preview 'preview $shadow_sandbox $status $upstream_response_time';
log_format shadow_metrics_sdk 'sdk $shadow_sandbox $status $upstream_response_time';
{{- end }}
# Where a request goes when its sandbox's Pod refused the connection: asked again and held while the sandbox
# wakes, then sent to the new Pod (no body), or answered 307 to the same address (a body is not sent twice).
map "$http_content_length$http_transfer_encoding" $shadow_on_refused {
  ""      @shadow_retry;
  "0"     @shadow_retry;
  default @shadow_resend;
}
proxy_cache_path /tmp/auth-cache levels=1:2 keys_zone=shadow_auth:4m max_size=32m inactive=60s use_temp_path=off;
upstream shadow_router_auth {
  server 127.0.0.1:{{ $r.ports.auth }};
  keepalive 32;
}
# Pages from nginx itself only when router-auth cannot answer (never nginx's default pages).
map $server_port $shadow_down_page {
  default '<!doctype html><html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="5"><title>Preview router restarting</title></head><body><h1>The preview router is restarting</h1><p>Try again in a few seconds.</p></body></html>';
}
server {
  # Anything that is not <sandbox>.<domain> (an IP, another domain, a bad label, no Host) lands here.
  listen {{ $r.ports.preview }} default_server;
  server_name _;
  # Readiness of the whole pod: nginx up and router-auth's watches synced. /livez is nginx alone.
  location = /healthz {
    access_log off;
    proxy_pass http://shadow_router_auth/readyz;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
  }
  location = /livez { access_log off; default_type text/plain; return 200 "ok\n"; }
  location / {
    rewrite ^ /page/preview? break;
    proxy_pass http://shadow_router_auth;
    proxy_http_version 1.1;
    proxy_method GET;
    proxy_pass_request_body off;
    proxy_set_header Content-Length "";
    proxy_set_header Connection "";
    proxy_set_header X-Original-Host $host;
    proxy_set_header X-Original-URI $request_uri;
    error_page 500 502 503 504 = @shadow_down;
  }
  location @shadow_down { default_type text/html; return 503 $shadow_down_page; }
  error_page 400 = @shadow_bad_request;
  location @shadow_bad_request { default_type text/html; return 400 '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Bad request</title></head><body><h1>Bad request</h1><p>No preview is served at this address.</p></body></html>'; }
}
server {
  listen {{ $r.ports.preview }};
  # <sandbox>.<domain>: exactly one DNS label in front of the domain. Quoted: the regex has braces.
  server_name "~^(?<sandbox>[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)\.{{ $r.domain | replace "." "\\." }}$";
  client_max_body_size {{ $r.maxBodySize }};
  {{- if $r.metrics.enabled }}
  # A server-level access_log replaces the inherited one: the image's stdout log is kept beside it.
  access_log /dev/stdout;
  access_log syslog:server=127.0.0.1:{{ $r.ports.accessLog }},nohostname,tag=shadow_metrics shadow_metrics_preview if=$shadow_sandbox;
  {{- end }}
  location = /_shadow/auth {
    internal;
    proxy_pass http://shadow_router_auth/auth/preview;
    {{- include "shadow-operator.previewAuth" . | nindent 4 }}
  }
  # Asked after the upstream refused the connection: never answered from the cache, and the answer replaces
  # the cached one (the Pod it named is gone).
  location = /_shadow/auth-retry {
    internal;
    proxy_pass http://shadow_router_auth/auth/preview/retry;
    proxy_set_header X-Shadow-Failed-Upstream $shadow_upstream;
    proxy_cache_bypass 1;
    {{- include "shadow-operator.previewAuth" . | nindent 4 }}
  }
  location / {
    auth_request /_shadow/auth;
    error_page 401 403 = @shadow_refused;
    # The sandbox's Pod refused the connection (going down as its sandbox falls asleep): ask again, and wait.
    # A request with a body cannot be sent twice: its page waits instead, then sends the client again (307).
    error_page 502 = $shadow_on_refused;
    error_page 500 504 = @shadow_unreachable;
    {{- include "shadow-operator.previewProxy" . | nindent 4 }}
  }
  location @shadow_retry {
    auth_request /_shadow/auth-retry;
    recursive_error_pages on;
    error_page 401 403 500 502 504 = @shadow_unreachable;
    {{- include "shadow-operator.previewProxy" . | nindent 4 }}
  }
  location @shadow_resend {
    auth_request /_shadow/auth-retry;
    recursive_error_pages on;
    error_page 401 403 500 502 504 = @shadow_unreachable;
    rewrite ^ /page/preview/unreachable? break;
    proxy_pass http://shadow_router_auth;
    proxy_http_version 1.1;
    proxy_method GET;
    proxy_pass_request_body off;
    proxy_set_header Content-Length "";
    proxy_set_header Connection "";
    proxy_set_header Upgrade "";
    proxy_set_header X-Original-Host $host;
    proxy_set_header X-Original-URI $request_uri;
    proxy_set_header X-Shadow-Failed-Upstream $shadow_upstream;
    proxy_redirect off;
  }
  location @shadow_refused {
    rewrite ^ /page/preview? break;
    proxy_pass http://shadow_router_auth;
    proxy_http_version 1.1;
    proxy_method GET;
    proxy_pass_request_body off;
    proxy_set_header Content-Length "";
    proxy_set_header Connection "";
    proxy_set_header Upgrade "";
    proxy_set_header X-Original-Host $host;
    proxy_set_header X-Original-URI $request_uri;
    proxy_redirect off;
    recursive_error_pages on;
    error_page 500 502 503 504 = @shadow_down;
  }
  location @shadow_unreachable {
    rewrite ^ /page/preview/unreachable? break;
    proxy_pass http://shadow_router_auth;
    proxy_http_version 1.1;
    proxy_method GET;
    proxy_pass_request_body off;
    proxy_set_header Content-Length "";
    proxy_set_header Connection "";
    proxy_set_header Upgrade "";
    proxy_set_header X-Original-Host $host;
    proxy_set_header X-Original-URI $request_uri;
    proxy_set_header X-Shadow-Failed-Upstream $shadow_upstream;
    proxy_read_timeout {{ add (int $r.holdSeconds) 10 }}s;
    recursive_error_pages on;
    error_page 500 502 503 504 = @shadow_down;
  }
  location @shadow_down { default_type text/html; return 503 $shadow_down_page; }
}
{{- if $r.sdk.enabled }}
# The k8s-agent-sandbox SDK contract (its router's): X-Sandbox-ID, -Namespace, -Port (optionally -Pod-IP, -UID)
# name the sandbox; the caller's Authorization and Host are dropped and the runtime token is attached here.
# Who may: router-auth decides from the caller's bearer token and from X-Shadow-Peer, the address the
# connection came from ($remote_addr; loopback is a kubectl port-forward). proxy_set_header replaces any
# X-Shadow-Peer the client sent, and the peer is part of the cache key: an answer allowed to a port-forward is
# never reused for a caller from the network.
server {
  listen {{ $r.ports.sdk }} default_server;
  server_name _;
  client_max_body_size {{ $r.maxBodySize }};
  {{- if $r.metrics.enabled }}
  access_log /dev/stdout;
  access_log syslog:server=127.0.0.1:{{ $r.ports.accessLog }},nohostname,tag=shadow_metrics shadow_metrics_sdk if=$shadow_sandbox;
  {{- end }}
  location = /healthz { access_log off; default_type application/json; return 200 '{"status":"ok"}'; }
  location = /_shadow/auth {
    internal;
    proxy_pass http://shadow_router_auth/auth/sdk;
    {{- include "shadow-operator.sdkAuth" . | nindent 4 }}
  }
  location = /_shadow/auth-retry {
    internal;
    proxy_pass http://shadow_router_auth/auth/sdk/retry;
    proxy_set_header X-Shadow-Failed-Upstream $shadow_upstream;
    proxy_cache_bypass 1;
    {{- include "shadow-operator.sdkAuth" . | nindent 4 }}
  }
  location / {
    auth_request /_shadow/auth;
    error_page 401 403 = @shadow_refused;
    error_page 502 = $shadow_on_refused;
    error_page 500 504 = @shadow_unreachable;
    {{- include "shadow-operator.sdkProxy" . | nindent 4 }}
  }
  location @shadow_retry {
    auth_request /_shadow/auth-retry;
    recursive_error_pages on;
    error_page 401 403 500 502 504 = @shadow_unreachable;
    {{- include "shadow-operator.sdkProxy" . | nindent 4 }}
  }
  location @shadow_resend {
    auth_request /_shadow/auth-retry;
    recursive_error_pages on;
    error_page 401 403 500 502 504 = @shadow_unreachable;
    rewrite ^ /page/sdk/unreachable? break;
    proxy_pass http://shadow_router_auth;
    proxy_http_version 1.1;
    proxy_method GET;
    proxy_pass_request_body off;
    proxy_set_header Content-Length "";
    proxy_set_header Connection "";
    proxy_set_header Upgrade "";
    proxy_set_header X-Shadow-Peer $remote_addr;
    proxy_set_header X-Original-URI $request_uri;
    proxy_set_header X-Shadow-Failed-Upstream $shadow_upstream;
    proxy_redirect off;
  }
  location @shadow_refused {
    rewrite ^ /page/sdk? break;
    proxy_pass http://shadow_router_auth;
    proxy_http_version 1.1;
    proxy_method GET;
    proxy_pass_request_body off;
    proxy_set_header Content-Length "";
    proxy_set_header Connection "";
    proxy_set_header Upgrade "";
    proxy_set_header X-Shadow-Peer $remote_addr;
    recursive_error_pages on;
    error_page 500 502 503 504 = @shadow_sdk_down;
  }
  location @shadow_unreachable {
    rewrite ^ /page/sdk/unreachable? break;
    proxy_pass http://shadow_router_auth;
    proxy_http_version 1.1;
    proxy_method GET;
    proxy_pass_request_body off;
    proxy_set_header Content-Length "";
    proxy_set_header Connection "";
    proxy_set_header Upgrade "";
    proxy_set_header X-Shadow-Peer $remote_addr;
    proxy_set_header X-Original-URI $request_uri;
    proxy_set_header X-Shadow-Failed-Upstream $shadow_upstream;
    proxy_read_timeout {{ add (int $r.holdSeconds) 10 }}s;
    recursive_error_pages on;
    error_page 500 502 503 504 = @shadow_sdk_down;
  }
  location @shadow_sdk_down { default_type application/json; return 502 '{"detail":"sandbox router unavailable"}'; }
}
{{- end }}
{{- end }}
