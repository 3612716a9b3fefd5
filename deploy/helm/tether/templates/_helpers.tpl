{{- define "tether.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tether.labels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: tether
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: kas, hub or redis. */}}
{{- define "tether.selector" -}}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/name: {{ .component }}
{{- end -}}

{{- define "tether.image" -}}
{{ .image.repository }}:{{ default .root.Chart.AppVersion .image.tag }}
{{- end -}}

{{- define "tether.secretName" -}}
{{- default (printf "%s-secrets" (include "tether.fullname" .)) .Values.secrets.existingSecret -}}
{{- end -}}

{{- define "tether.redisAddress" -}}
{{- if .Values.redis.bundled -}}
{{- printf "%s-redis:6379" (include "tether.fullname" .) -}}
{{- else if .Values.redis.external.address -}}
{{- .Values.redis.external.address -}}
{{- else -}}
{{- fail "redis.bundled is false: set redis.external.address (host:port)" -}}
{{- end -}}
{{- end -}}

{{/* kas' mounts of the Sentinel password and the Redis TLS files (redis.external.sentinel / .tls). */}}
{{- define "tether.redisMounts" -}}
{{- $ext := .Values.redis.external -}}
{{- if not .Values.redis.bundled -}}
{{- if and $ext.sentinel.masterName $ext.sentinel.passwordSecret }}
- { name: redis-sentinel-password, mountPath: /etc/tether/redis-sentinel, readOnly: true }
{{- end }}
{{- if and $ext.tls.enabled $ext.tls.caSecret }}
- { name: redis-tls-ca, mountPath: /etc/tether/redis-tls/ca, readOnly: true }
{{- end }}
{{- if and $ext.tls.enabled $ext.tls.clientSecret }}
- { name: redis-tls-client, mountPath: /etc/tether/redis-tls/client, readOnly: true }
{{- end }}
{{- end -}}
{{- end -}}

{{/* The Secrets behind tether.redisMounts, one key each. */}}
{{- define "tether.redisVolumes" -}}
{{- $ext := .Values.redis.external -}}
{{- if not .Values.redis.bundled -}}
{{- if and $ext.sentinel.masterName $ext.sentinel.passwordSecret }}
- name: redis-sentinel-password
  secret:
    secretName: {{ $ext.sentinel.passwordSecret }}
    items: [{ key: password, path: password }]
{{- end }}
{{- if and $ext.tls.enabled $ext.tls.caSecret }}
- name: redis-tls-ca
  secret:
    secretName: {{ $ext.tls.caSecret }}
    items: [{ key: ca.crt, path: ca.crt }]
{{- end }}
{{- if and $ext.tls.enabled $ext.tls.clientSecret }}
- name: redis-tls-client
  secret:
    secretName: {{ $ext.tls.clientSecret }}
    items: [{ key: tls.crt, path: tls.crt }, { key: tls.key, path: tls.key }]
{{- end }}
{{- end -}}
{{- end -}}
