import Logging
import UploadProtocol

/// A text log handler (swift-log's `StreamLogHandler`, say) behind which every message and metadata value is
/// ``Printable/escaped(_:)``: what a peer, a file name or a hook put in a log line can neither start a line of its own
/// (a forged entry) nor send escape sequences to the terminal of whoever reads the log.
public struct PrintableLogHandler<Wrapped: LogHandler>: LogHandler {
    private var wrapped: Wrapped

    public init(_ wrapped: Wrapped) {
        self.wrapped = wrapped
    }

    public var logLevel: Logger.Level {
        get { self.wrapped.logLevel }
        set { self.wrapped.logLevel = newValue }
    }

    public var metadata: Logger.Metadata {
        get { self.wrapped.metadata }
        set { self.wrapped.metadata = newValue.mapValues(Self.escaped) }
    }

    public var metadataProvider: Logger.MetadataProvider? {
        get { self.wrapped.metadataProvider }
        set { self.wrapped.metadataProvider = newValue.map { provider in Logger.MetadataProvider { provider.get().mapValues(Self.escaped) } } }
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { self.wrapped[metadataKey: key] }
        set { self.wrapped[metadataKey: key] = newValue.map(Self.escaped) }
    }

    public func log(event: LogEvent) {
        self.wrapped.log(
            level: event.level, message: "\(Printable.escaped(event.message.description))", metadata: event.metadata?.mapValues(Self.escaped),
            source: event.source, file: event.file, function: event.function, line: event.line)
    }

    static func escaped(_ value: Logger.Metadata.Value) -> Logger.Metadata.Value {
        switch value {
        case .string(let text): .string(Printable.escaped(text))
        case .stringConvertible(let convertible): .string(Printable.escaped(convertible.description))
        case .dictionary(let dictionary): .dictionary(dictionary.mapValues(Self.escaped))
        case .array(let array): .array(array.map(Self.escaped))
        }
    }
}
