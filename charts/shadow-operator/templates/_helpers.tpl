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
