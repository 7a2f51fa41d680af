{{/* nginx server block of the preview router; also hashed into the Deployment to roll it on change. */}}
{{- define "shadow-operator.previewRouterConf" -}}
map $http_upgrade $connection_upgrade {
  default upgrade;
  ''      close;
}
server {
  listen 8080;
  # <sandbox>.<domain>: the sandbox name is a DNS label, so the slug is one too. Quoted: the regex has braces.
  server_name "~^(?<sandbox>[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)\.{{ .Values.previewRouter.domain | replace "." "\\." }}$";
  # Re-resolve often: sandboxes come and go, and their pod IPs with them.
  resolver {{ .Values.previewRouter.resolver }} valid=5s ipv6=off;
  resolver_timeout 2s;
  location / {
    proxy_pass http://$sandbox.{{ include "shadow-operator.templateNamespace" . }}.svc.{{ .Values.operator.clusterDomain }}:{{ .Values.defaultTemplate.previewPort }};
    proxy_http_version 1.1;
    proxy_set_header Host $host;
    proxy_set_header Upgrade $http_upgrade;
    proxy_set_header Connection $connection_upgrade;
    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    proxy_set_header X-Forwarded-Proto $scheme;
    proxy_read_timeout 3600s;
    proxy_send_timeout 3600s;
    proxy_buffering off;
  }
}
{{- end }}
