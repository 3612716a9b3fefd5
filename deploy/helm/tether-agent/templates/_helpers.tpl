{{- define "tether-agent.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tether-agent.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tether-agent.labels" -}}
{{ include "tether-agent.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tether-agent.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tether-agent.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the agent token under the key `token`. */}}
{{- define "tether-agent.tokenSecretName" -}}
{{- if .Values.config.token -}}
{{- printf "%s-token" (include "tether-agent.fullname" .) -}}
{{- else if .Values.config.secretName -}}
{{- .Values.config.secretName -}}
{{- else -}}
{{- fail "set config.token (the agent token) or config.secretName (an existing Secret with the key `token`)" -}}
{{- end -}}
{{- end -}}

{{/* kas' port from config.kasAddress: the explicit port, else 443 for grpcs:// and 80 for grpc://. */}}
{{- define "tether-agent.kasPort" -}}
{{- $address := .Values.config.kasAddress -}}
{{- $port := regexFind ":[0-9]+/?$" $address | trimPrefix ":" | trimSuffix "/" -}}
{{- if $port -}}{{ $port }}{{- else if hasPrefix "grpcs://" $address -}}443{{- else -}}80{{- end -}}
{{- end -}}

{{- define "tether-agent.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}
