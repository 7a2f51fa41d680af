{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "shadow-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name; the release name alone when it already contains the chart name. */}}
{{- define "shadow-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "shadow-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "shadow-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "shadow-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shadow-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "shadow-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "shadow-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Namespace of the default template, its warm pool and the sandboxes the preview router serves. */}}
{{- define "shadow-operator.templateNamespace" -}}
{{- default .Release.Namespace .Values.defaultTemplate.namespace }}
{{- end }}

{{/*
Namespaces tenants work in, as a JSON list: tenants.namespaces plus, with tenants.namespaceSelector.matchLabels,
every existing namespace carrying those labels. The selector is read with `lookup` when Helm installs or
upgrades (a namespace labelled later is prepared by the next `helm upgrade`); `helm template` has no cluster and
sees none. Use: include "shadow-operator.tenantNamespaces" . | fromJsonArray
*/}}
{{- define "shadow-operator.tenantNamespaces" -}}
{{- $names := list }}
{{- range .Values.tenants.namespaces }}
{{- $names = append $names . }}
{{- end }}
{{- with .Values.tenants.namespaceSelector.matchLabels }}
{{- $selector := . }}
{{- range (lookup "v1" "Namespace" "" "").items }}
{{- $labels := .metadata.labels | default dict }}
{{- $match := true }}
{{- range $key, $value := $selector }}
{{- if ne (toString (get $labels $key)) (toString $value) }}
{{- $match = false }}
{{- end }}
{{- end }}
{{- if and $match (not .metadata.deletionTimestamp) }}
{{- $names = append $names .metadata.name }}
{{- end }}
{{- end }}
{{- end }}
{{- $names | uniq | sortAlpha | toJson }}
{{- end }}

{{/*
Namespaces the operator serves, as a JSON list: empty (the whole cluster) unless operator.watchNamespaces is set,
then those and the tenants' namespaces. Use: include "shadow-operator.watchNamespaces" . | fromJsonArray
*/}}
{{- define "shadow-operator.watchNamespaces" -}}
{{- if .Values.operator.watchNamespaces }}
{{- concat .Values.operator.watchNamespaces (include "shadow-operator.tenantNamespaces" . | fromJsonArray) | uniq | toJson }}
{{- else }}
{{- list | toJson }}
{{- end }}
{{- end }}

{{/*
Image reference: registry (global.imageRegistry wins) / repository, then @digest or :tag (appVersion by
default). Usage: include "shadow-operator.image" (dict "image" .Values.operator.image "root" $)
*/}}
{{- define "shadow-operator.image" -}}
{{- $registry := default .image.registry .root.Values.global.imageRegistry }}
{{- $repository := required "image.repository is required" .image.repository }}
{{- $ref := ternary (printf "%s/%s" $registry $repository) $repository (ne $registry "") }}
{{- if .image.digest }}
{{- printf "%s@%s" $ref .image.digest }}
{{- else }}
{{- printf "%s:%s" $ref (default .root.Chart.AppVersion .image.tag) }}
{{- end }}
{{- end }}

{{- define "shadow-operator.imagePullSecrets" -}}
{{- with .Values.global.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end }}

{{/* Capabilities a sandbox container may add without podSecurity.allowPrivileged: Pod Security Standards
"baseline"'s set, as a CEL list (the operator's copy: resources/podsecurity.py SAFE_CAPABILITIES). */}}
{{- define "shadow-operator.safeCapabilities" -}}
['AUDIT_WRITE', 'CHOWN', 'DAC_OVERRIDE', 'FOWNER', 'FSETID', 'KILL', 'MKNOD', 'NET_BIND_SERVICE', 'SETFCAP', 'SETGID', 'SETPCAP', 'SETUID', 'SYS_CHROOT']
{{- end }}

{{/* Pod Security Standards "baseline": the sysctls a pod may set and the SELinux types it may ask for, as CEL
lists (the operator's copies: resources/podsecurity.py SAFE_SYSCTLS, SAFE_SELINUX_TYPES). */}}
{{- define "shadow-operator.safeSysctls" -}}
['kernel.shm_rmid_forced', 'net.ipv4.ip_local_port_range', 'net.ipv4.ip_unprivileged_port_start', 'net.ipv4.tcp_syncookies', 'net.ipv4.ping_group_range', 'net.ipv4.ip_local_reserved_ports', 'net.ipv4.tcp_keepalive_time', 'net.ipv4.tcp_fin_timeout', 'net.ipv4.tcp_keepalive_intvl', 'net.ipv4.tcp_keepalive_probes', 'net.ipv4.tcp_rmem', 'net.ipv4.tcp_wmem']
{{- end }}

{{- define "shadow-operator.safeSELinuxTypes" -}}
['', 'container_t', 'container_init_t', 'container_kvm_t', 'container_engine_t']
{{- end }}
