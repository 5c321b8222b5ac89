// ida_eval's stand-in for the KellermanSoftware.CompareNetObjects NuGet package (Compare-NET-Objects
// 4.77.0, which MBXP C# tests use), compiled with every C# program under Mono's mcs (C# <= 7): no
// .NET SDK or NuGet feed is needed. It offers the part of the API the tests call --
// new CompareLogic().Compare(expected, actual).AreEqual -- with the library's default rules:
//   * null equals only null; objects of different runtime types are different (IgnoreObjectTypes=false);
//   * strings, primitives, decimal, enums, DateTime, Guid etc. compare with Equals (double: exact,
//     NaN equals NaN, as the library's default DoublePrecision of 0);
//   * dictionaries compare by key (equal counts, every key present, values equal), whatever their
//     insertion order (MBCSP/87 passes under the real library with the keys in another order);
//   * sets, lists, arrays and other enumerables compare element by element in enumeration order
//     with equal counts (IgnoreCollectionOrder=false; a HashSet's order is its insertion history);
//   * other objects (tuples, KeyValuePair, classes, structs) compare their public instance
//     properties (no indexers) and public fields, recursively.
// Known differences from the real library: its type-specific comparers (DataSet, DataTable, streams,
// IPEndPoint, ...), Config options other than the defaults, and the text of DifferencesString are
// not reproduced; the real library also compares some private state of a few BCL types. MBXP tests
// compare numbers, strings, bools, lists, arrays, dictionaries, sets and tuples, for which the rules
// above are the library's.
using System;
using System.Collections;
using System.Reflection;

namespace KellermanSoftware.CompareNetObjects
{
    public class ComparisonConfig
    {
        public bool IgnoreObjectTypes;
        public bool IgnoreCollectionOrder;
        public double DoublePrecision;
        public int MaxDifferences = 1;
    }

    public class ComparisonResult
    {
        public bool AreEqual { get; internal set; }
        public string DifferencesString { get; internal set; }
        public bool ExceededDifferences { get { return !AreEqual; } }
    }

    public class CompareLogic
    {
        public ComparisonConfig Config { get; set; }

        public CompareLogic() { Config = new ComparisonConfig(); }

        public CompareLogic(ComparisonConfig config) { Config = config ?? new ComparisonConfig(); }

        public ComparisonResult Compare(object expectedObject, object actualObject)
        {
            string why = Difference(expectedObject, actualObject, "", 0);
            return new ComparisonResult { AreEqual = why == null, DifferencesString = why ?? "" };
        }

        string Difference(object a, object b, string path, int depth)
        {
            if (a == null && b == null) return null;
            if (a == null || b == null) return path + ": one side is null";
            if (depth > 64) return null;  // cyclic structures: the library stops similarly (MaxStructDepth)
            Type ta = a.GetType(), tb = b.GetType();
            if (!Config.IgnoreObjectTypes && ta != tb)
                return path + ": different types " + ta.FullName + " and " + tb.FullName;
            if (a is string || ta.IsPrimitive || ta.IsEnum || a is decimal || a is DateTime || a is Guid
                || a is DateTimeOffset || a is TimeSpan || a is Type)
            {
                if (Config.DoublePrecision > 0 && (a is double || a is float))
                {
                    double x = Convert.ToDouble(a), y = Convert.ToDouble(b);
                    return Math.Abs(x - y) <= Config.DoublePrecision ? null : path + ": " + a + " != " + b;
                }
                return a.Equals(b) ? null : path + ": " + a + " != " + b;
            }
            if (a is IDictionary && b is IDictionary)  // by key, as the library's dictionary comparer
            {
                IDictionary da = (IDictionary)a, db = (IDictionary)b;
                if (da.Count != db.Count) return path + ": different counts";
                foreach (object key in da.Keys)
                {
                    if (!db.Contains(key)) return path + "[" + key + "]: missing";
                    string d = Difference(da[key], db[key], path + "[" + key + "]", depth + 1);
                    if (d != null) return d;
                }
                return null;
            }
            if (a is IEnumerable && b is IEnumerable)
            {
                var ea = ((IEnumerable)a).GetEnumerator();
                var eb = ((IEnumerable)b).GetEnumerator();
                int i = 0;
                while (true)
                {
                    bool ma = ea.MoveNext(), mb = eb.MoveNext();
                    if (ma != mb) return path + ": different counts";
                    if (!ma) break;
                    string d = Difference(ea.Current, eb.Current, path + "[" + i + "]", depth + 1);
                    if (d != null) return d;
                    i++;
                }
                return null;
            }
            foreach (PropertyInfo p in ta.GetProperties(BindingFlags.Public | BindingFlags.Instance))
            {
                if (!p.CanRead || p.GetIndexParameters().Length > 0) continue;
                string d = Difference(p.GetValue(a, null), p.GetValue(b, null), path + "." + p.Name, depth + 1);
                if (d != null) return d;
            }
            foreach (FieldInfo f in ta.GetFields(BindingFlags.Public | BindingFlags.Instance))
            {
                string d = Difference(f.GetValue(a), f.GetValue(b), path + "." + f.Name, depth + 1);
                if (d != null) return d;
            }
            return null;
        }
    }
}
